"""The GPU health rules on real H100 output (tests/node/gpu/fixtures/h100-80gb-hbm3, a copy of the
shared ../shared/fixtures/gpu/h100-80gb-hbm3 recorded on an H100; its README says how), and
on faults derived from it the way they show up: a raised counter, a pending remap, an Xid
line in the kernel's format, a narrower link, a missing GPU, a slowdown."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from kilonode.entry import main
from kilonode.node.gpu.readings import UnusableInput, read_dir
from kilonode.node.gpu.rules import FABRIC_COMPLETED, FABRIC_NONE, evaluate, fabric_phase, thresholds, xid_catalog
from kilonode.node.ship import GPU_HEALTH

FIXTURES = Path(__file__).with_name("fixtures") / "h100-80gb-hbm3"
H100 = "NVIDIA H100 80GB HBM3"


def writable_copy(tmp_path: Path) -> Path:
    """A writable copy of the recorded outputs (the fixtures are read-only)."""
    copy = tmp_path / "node"
    shutil.copytree(FIXTURES, copy)
    for path in [copy, *copy.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return copy


@pytest.fixture
def node(tmp_path: Path) -> Path:
    return writable_copy(tmp_path)


def edit(path: Path, change: Callable[[str], str]) -> None:
    before = path.read_text()
    after = change(before)
    assert after != before, f"the edit changed nothing in {path.name}"
    path.write_text(after)


def sub(pattern: str, replacement: str) -> Callable[[str], str]:
    return lambda text: re.sub(pattern, replacement, text, count=1, flags=re.S)


def faults(node: Path, expect_gpus: int | None = 1) -> dict[str, str]:
    return {f.check: f.evidence for f in evaluate(read_dir(node), expect_gpus) if f.taints}


def kilonode(*args: str) -> subprocess.CompletedProcess[str]:
    """`kilonode gpu-health ARGS` in a process of its own, as on a node."""
    return subprocess.run([sys.executable, "-m", "kilonode.cli", "gpu-health", *args], capture_output=True,
                          text=True, timeout=60, check=False)


GpuHealth = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def gpu_health(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> GpuHealth:
    """`kilonode gpu-health ARGS` run in this process through the console script's entry point
    (a process per call would start the interpreter and import the package each time; one
    test runs the real one, `kilonode` above)."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        argv = ["kilonode", "gpu-health", *args]
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(SystemExit) as done:
            main()
        captured = capsys.readouterr()
        return subprocess.CompletedProcess(argv, int(done.value.code or 0), captured.out, captured.err)

    return run


# --- the recorded outputs ------------------------------------------------------------------

def test_the_recorded_h100_is_read_as_it_is_and_passes(node: Path) -> None:
    readings = read_dir(node)
    assert readings.driver == "580.159.04"
    [gpu] = readings.gpus
    assert (gpu.name, gpu.uuid, gpu.bus_id) == (H100, "GPU-7b81450a-b098-19f7-62c8-e757cc988445", "00000000:00:06.0")
    assert (gpu.ecc_uncorrectable_volatile, gpu.ecc_uncorrectable_aggregate) == (0, 0)
    assert gpu.pcie_gen == (5, 5) and gpu.pcie_width == (16, 16)
    assert gpu.clock_event_reasons == {"gpu_idle"} and gpu.nvlink_down == ()
    assert gpu.retired_pages_pending is None  # H100 remaps rows; nvidia-smi says N/A
    # the kernel log holds NVRM lines but no Xid
    assert readings.xids == () and "NVRM" in (node / "dmesg-xid.txt").read_text()
    assert evaluate(readings, expect_gpus=1) == []


def test_a_gpu_at_its_power_cap_under_load_is_healthy(node: Path) -> None:
    (node / "nvidia-smi-q.xml").write_text((FIXTURES / "under-load" / "nvidia-smi-q-under-load.xml").read_text())
    [gpu] = read_dir(node).gpus
    assert "sw_power_cap" in gpu.clock_event_reasons and "gpu_idle" not in gpu.clock_event_reasons
    assert faults(node) == {}


def test_the_active_checks_floors_sit_under_every_recorded_healthy_run() -> None:
    floors = thresholds()["models"][H100]["pytorch_cu130"]  # the stack the fixtures were measured with
    burn = json.loads((FIXTURES / "burn.json").read_text())
    durations = json.loads((FIXTURES / "under-load" / "burn-durations.json").read_text())
    runs = [*durations["runs"], durations["cold_start_2s"]]
    assert min(r["tflops_p10"] for r in runs) > floors["gemm_bf16_tflops_floor"]
    assert burn["gemm_bf16_8192"]["tflops_median"] > floors["gemm_bf16_tflops_floor"]
    assert burn["gemm_bf16_max_rel_error_vs_fp64"] < floors["gemm_max_relative_error"]
    assert burn["d2d_copy_TBps_read_plus_write"] > floors["copy_tbps_floor"]
    # ... and not so far under that a GPU at 85% of the recorded one would pass
    assert floors["gemm_bf16_tflops_floor"] > 0.85 * min(r["tflops_median"] for r in runs) * 0.99


# --- faults derived from them --------------------------------------------------------------

XML = "nvidia-smi-q.xml"


def fabric(state: str, status: str) -> Callable[[str], str]:
    """The recording's one GPU with its NVSwitch fabric registration in `state` and `status`
    (the recording, one H100 passed through to a VM without NVSwitch, says N/A and N/A)."""
    return sub(r"(<fabric>\s*<state>)[^<]*(</state>\s*<status>)[^<]*<", rf"\g<1>{state}\g<2>{status}<")


DERIVED = {
    "ecc-volatile": (XML, sub(r"(<volatile>.*?<dram_uncorrectable>)0<", r"\g<1>2<")),
    "ecc-aggregate": (XML, sub(r"(<aggregate>.*?<sram_uncorrectable_secded>)0<", r"\g<1>1<")),
    "remapped-rows-pending": (XML, sub(r"<remapped_row_pending>No<", "<remapped_row_pending>Yes<")),
    "remapped-rows-failure": (XML, sub(r"<remapped_row_failure>No<", "<remapped_row_failure>Yes<")),
    "clock-slowdown": (XML, sub(r"(<clocks_event_reason_hw_thermal_slowdown>)Not Active<", r"\g<1>Active<")),
    # judged while the GPU is busy: at idle nvidia-smi(1) says the width may be reduced
    "pcie-width": (XML, lambda text: sub(r"<current_link_width>16x<", "<current_link_width>8x<")(
        sub(r"(<clocks_event_reason_gpu_idle>)Active<", r"\g<1>Not Active<")(text))),
    # Fabric Manager not (or no longer) running, or still training: no CUDA work can start
    "fabric-not-completed": (XML, fabric("In Progress", "N/A")),
    # registered, with an error status (seen on Azure: azhpc-images pull request 506)
    "fabric-failed": (XML, fabric("Completed", "Insufficient Resources")),
    "active-gemm": ("burn.json", sub(r'"tflops_median": [0-9.]+', '"tflops_median": 512.0')),
    "active-gemm-correctness": ("burn.json", sub(r'"gemm_bf16_max_rel_error_vs_fp64": [0-9.]+',
                                                 '"gemm_bf16_max_rel_error_vs_fp64": 0.37')),
    "active-memory-bandwidth": ("burn.json", sub(r'"d2d_copy_TBps_read_plus_write": [0-9.]+',
                                                 '"d2d_copy_TBps_read_plus_write": 2.1')),
}


@pytest.mark.parametrize("check", sorted(DERIVED))
def test_each_derived_fault_takes_the_node_out_naming_itself(node: Path, check: str, gpu_health: GpuHealth) -> None:
    file, change = DERIVED[check]
    edit(node / file, change)
    assert list(faults(node)) == [check]
    result = gpu_health("--from", str(node), "--expect-gpus", "1", "--dry-run")
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"FAULT {check}: " in result.stdout
    reason = "".join(part.capitalize() for part in check.split("-"))
    assert f"would report condition GPUHealthy=False reason={reason}" in result.stdout
    assert f"the controller would leave the node with taints: kilonode.io/gpu-unhealthy={reason}:NoSchedule\n" \
        in result.stdout


def test_a_gpu_without_an_nvswitch_fabric_says_n_a_and_has_nothing_to_register(node: Path) -> None:
    # the recording: one H100 passed through to a VM, no NVSwitch: <fabric><state>N/A</state>
    # <status>N/A</status> (driver 580); read as no fabric, neither waited for nor judged
    [gpu] = read_dir(node).gpus
    assert (gpu.fabric_state, gpu.fabric_status) == ("N/A", "N/A")
    assert fabric_phase(gpu) == FABRIC_NONE
    edit(node / XML, fabric("Not Supported", "N/A"))
    [gpu] = read_dir(node).gpus
    assert fabric_phase(gpu) == FABRIC_NONE and faults(node) == {}
    # (the control: a GPU with a fabric that is not registered is judged)
    edit(node / XML, fabric("In Progress", "N/A"))
    assert list(faults(node)) == ["fabric-not-completed"]
    # registered: Completed with status Success passes; the status counts only once Completed
    edit(node / XML, fabric("Completed", "Success"))
    [gpu] = read_dir(node).gpus
    assert fabric_phase(gpu) == FABRIC_COMPLETED and faults(node) == {}


def test_a_fabric_state_this_agent_does_not_know_is_never_healthy(node: Path) -> None:
    edit(node / XML, fabric("Degraded", "Success"))
    assert faults(node) == {"fabric-failed": "fabric/state = Degraded, fabric/status = Success"}


def test_a_missing_gpu_is_a_fault(node: Path) -> None:
    assert faults(node, expect_gpus=8) == {"gpu-count": "nvidia-smi lists 1: 00000000:00:06.0"}
    # the GPU gone from the bus altogether
    edit(node / XML, sub(r"<gpu id=.*</gpu>", ""))
    edit(node / XML, sub(r"<attached_gpus>1<", "<attached_gpus>0<"))
    assert faults(node) == {"gpu-count": "nvidia-smi lists 0: none"}


def test_link_generation_counts_only_while_the_gpu_is_busy(node: Path) -> None:
    edit(node / XML, sub(r"<current_link_gen>5<", "<current_link_gen>1<"))
    assert faults(node) == {}  # idle: the link trains down to save power
    edit(node / XML, sub(r"(<clocks_event_reason_gpu_idle>)Active<", r"\g<1>Not Active<"))
    assert faults(node) == {"pcie-generation": "link gen 1 of 5"}


def test_a_narrower_link_at_idle_is_recorded_and_taints_only_while_busy(node: Path) -> None:
    edit(node / XML, sub(r"<current_link_width>16x<", "<current_link_width>8x<"))
    found = {f.check: f.taints for f in evaluate(read_dir(node), 1)}
    assert found == {"pcie-width-idle": False}
    edit(node / XML, sub(r"(<clocks_event_reason_gpu_idle>)Active<", r"\g<1>Not Active<"))
    assert faults(node) == {"pcie-width": "link width x8 of x16"}


def test_an_inactive_nvlink_link_is_a_fault_where_the_gpu_has_links(node: Path) -> None:
    nvml = json.loads((node / "nvml.json").read_text())
    nvml["gpus"][0]["nvlink_state"] = [1] * 17 + [0]
    (node / "nvml.json").write_text(json.dumps(nvml))
    assert faults(node) == {"nvlink-down": "links 17"}


def xid_line(code: int, text: str) -> str:
    # the driver's format (the catalogue's examples; open-gpu-kernel-modules' Xid logging)
    return f"[ 7201.554332] NVRM: Xid (PCI:0000:00:06): {code}, pid=4242, name=python3, {text}\n"


def test_xid_events_are_classified_by_nvidias_catalogue(node: Path, gpu_health: GpuHealth) -> None:
    catalog = xid_catalog()
    acting = sorted(code for code, row in catalog.items()
                    if row.get("immediate") not in {"RESTART_APP", "IGNORE", "WORKFLOW_XID_45"})
    app = sorted(code for code, row in catalog.items() if row.get("immediate") == "RESTART_APP")
    assert 79 in acting and app, "the catalogue read here lists both kinds"
    log = node / "dmesg-xid.txt"
    log.write_text(log.read_text() + xid_line(app[0], "an application's fault"))
    findings = evaluate(read_dir(node), 1)
    assert [(f.check, f.taints, f.action) for f in findings] == [("xid", False, "RESTART_APP")]
    log.write_text(log.read_text() + xid_line(79, "GPU has fallen off the bus."))
    assert faults(node) == {"xid": xid_line(79, "GPU has fallen off the bus.").strip()}
    result = gpu_health("--from", str(node))
    assert result.returncode == 1 and "FAULT xid: Xid 79" in result.stdout
    assert f"recorded (no taint): xid: Xid {app[0]}" in result.stdout


def test_an_application_torn_down_is_not_a_gpu_fault_but_a_double_bit_error_beside_it_is(node: Path) -> None:
    log = node / "dmesg-xid.txt"
    log.write_text(log.read_text() + xid_line(45, "Ch 00000008, errorString CTX SWITCH TIMEOUT"))
    assert faults(node) == {}
    log.write_text(log.read_text() + xid_line(48, "DBE (double bit error) ECC error"))
    assert [f.action for f in evaluate(read_dir(node), 1) if f.taints] == ["WORKFLOW_XID_48"]


def test_an_xid_the_catalogue_does_not_list_is_a_fault_to_take_to_support(node: Path) -> None:
    unknown = next(code for code in range(900, 1000) if code not in xid_catalog())
    log = node / "dmesg-xid.txt"
    log.write_text(log.read_text() + xid_line(unknown, "something new"))
    [finding] = evaluate(read_dir(node), 1)
    assert finding.taints and finding.action == "CONTACT_SUPPORT"


# --- the command ----------------------------------------------------------------------------

def test_the_command_exits_0_when_healthy_and_says_what_it_did_not_check(node: Path) -> None:
    (node / "burn.json").unlink()
    result = kilonode("--from", str(node), "--expect-gpus", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "healthy" in result.stdout and "no burn.json: no active check figures" in result.stdout


@pytest.mark.parametrize(("damage", "message"), [
    (lambda d: (d / XML).unlink(), "no nvidia-smi-q.xml"),
    (lambda d: (d / XML).write_text("<nvidia_smi_log><gpu>"), "nvidia-smi-q.xml: not XML"),
    (lambda d: (d / XML).write_text("<html/>"), "not `nvidia-smi -q -x` output"),
    (lambda d: (d / "nvml.json").write_text("{"), "nvml.json: not JSON"),
])
def test_unusable_input_exits_2_naming_the_file(
    node: Path, damage: Callable[[Path], None], message: str, gpu_health: GpuHealth
) -> None:
    damage(node)
    with pytest.raises(UnusableInput, match=re.escape(message)):
        read_dir(node)
    result = gpu_health("--from", str(node))
    assert result.returncode == 2 and message in " ".join(result.stderr.split())


def test_thresholds_name_their_sources() -> None:
    text = (GPU_HEALTH.path / "thresholds.toml").read_text()
    data = tomllib.loads(text)
    assert set(data["clock_event_reasons"]["fault"]) == {
        "hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"}
    for key in ("gemm_bf16_tflops_floor", "gemm_max_relative_error", "copy_tbps_floor"):
        line = next(i for i, line in enumerate(text.splitlines()) if line.startswith(key))
        assert text.splitlines()[line - 1].startswith("#"), f"{key} says where it comes from"
