"""The agent on `nvidia-smi -q -x` outputs shaped by the schemas of the drivers it meets: v12
(driver 535: the element list from Debian bookworm's nvidia-smi 535.309.01-0+deb12u1; the GPU
image ships 535.261.03-1 of the same branch), v11 (470 and older drivers' tag names) and v13
(580, the real H100 recordings). Each built output is first checked against the element lists
derived from Debian's packages (fixtures/nvsmi/): every element it has is one the schema
declares under that parent, so the tests cannot drift into a shape no driver writes."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kilonode.node.gpu import agent
from kilonode.node.gpu.readings import CLOCK_REASONS, ECC_UNCORRECTABLE, parse_smi_xml, read_dir
from kilonode.node.gpu.rules import evaluate, gpu_findings, thresholds

HERE = Path(__file__).parent
SCHEMAS = HERE / "fixtures" / "nvsmi"
RECORDED = HERE / "fixtures" / "h100-80gb-hbm3"
A100 = "NVIDIA A100-SXM4-40GB"


def schema(version: int) -> dict[str, list[str]]:
    """nvsmi_device_v<version>.elements: element -> its declared children."""
    declared = {}
    for line in (SCHEMAS / f"nvsmi_device_v{version}.elements").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, children = line.partition(":")
            declared[name] = children.split()
    return declared


def conforms(xml: str, version: int) -> None:
    declared = schema(version)

    def walk(element: ET.Element) -> None:
        assert element.tag in declared, f"<{element.tag}> is not in nvsmi_device_v{version}"
        for child in element:
            assert child.tag in declared[element.tag], f"<{child.tag}> is not a child of <{element.tag}> in v{version}"
            walk(child)

    walk(ET.fromstring(xml))


def xml(version: int = 12, *, active: tuple[str, ...] = ("gpu_idle",), gen: tuple[int, int] = (1, 4),
        width: tuple[int, int] = (16, 16), sram_uncorrectable: int = 0, ecc: bool = True,
        reasons: bool = True, fabric: tuple[str, str] | None = None) -> str:
    """An A100's `nvidia-smi -q -x` in the v12 (535) or v11 (470) shape, with the elements the
    agent reads in the DTD's order (the rest of a real output omitted)."""
    block, prefix = CLOCK_REASONS[0] if version >= 12 else CLOCK_REASONS[1]
    names = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "hw_thermal_slowdown",
             "hw_power_brake_slowdown", "sync_boost", "sw_thermal_slowdown", "display_clocks_setting")
    clock = "".join(f"<{prefix}{n}>{'Active' if n in active else 'Not Active'}</{prefix}{n}>" for n in names)
    counters = (f"<sram_correctable>0</sram_correctable><sram_uncorrectable>{sram_uncorrectable}</sram_uncorrectable>"
                "<dram_correctable>0</dram_correctable><dram_uncorrectable>0</dram_uncorrectable>")
    return f"""<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v{version}.dtd">
<nvidia_smi_log><timestamp>Mon Nov 23 10:00:00 2026</timestamp>
<driver_version>{'535.309.01' if version == 12 else '470.256.02'}</driver_version>
<cuda_version>12.2</cuda_version><attached_gpus>1</attached_gpus>
<gpu id="00000001:00:00.0"><product_name>{A100}</product_name>
<uuid>GPU-00000000-0000-0000-0000-000000000001</uuid>
<pci><pci_gpu_link_info><pcie_gen><max_link_gen>{gen[1]}</max_link_gen><current_link_gen>{gen[0]}</current_link_gen>
</pcie_gen><link_widths><max_link_width>{width[1]}x</max_link_width><current_link_width>{width[0]}x</current_link_width>
</link_widths></pci_gpu_link_info></pci>
{f'<{block}>{clock}</{block}>' if reasons else ''}
{f'<ecc_errors><volatile>{counters}</volatile><aggregate>{counters}</aggregate></ecc_errors>' if ecc else ''}
<retired_pages><pending_blacklist>N/A</pending_blacklist><pending_retirement>N/A</pending_retirement></retired_pages>
<remapped_rows><remapped_row_corr>0</remapped_row_corr><remapped_row_unc>0</remapped_row_unc>
<remapped_row_pending>No</remapped_row_pending><remapped_row_failure>No</remapped_row_failure></remapped_rows>
{f'<fabric><state>{fabric[0]}</state><status>{fabric[1]}</status></fabric>' if fabric else ''}
</gpu></nvidia_smi_log>"""


def judged(text: str, version: int) -> dict[str, bool]:
    conforms(text, version)
    _, [gpu] = parse_smi_xml(text, "built")
    return {f.check: f.taints for f in gpu_findings(gpu, thresholds())}


def test_the_derived_schemas_declare_every_element_the_agent_maps() -> None:
    v11, v12 = schema(11), schema(12)
    assert {"sram_uncorrectable", "dram_uncorrectable", "double_bit"} <= set(v11["volatile"])
    assert {"sram_uncorrectable", "sram_uncorrectable_parity", "sram_uncorrectable_secded", "dram_uncorrectable",
            "double_bit"} <= set(v12["volatile"]) and "total" in v12["double_bit"]
    assert {leaf.split("/")[0] for leaf in ECC_UNCORRECTABLE} <= set(v12["volatile"]) | set(v12["aggregate"])
    assert "clocks_event_reasons" in v12["gpu"] and "clocks_throttle_reasons" in v11["gpu"]
    assert "clocks_event_reason_hw_thermal_slowdown" in v12["clocks_event_reasons"]
    assert "clocks_throttle_reason_hw_thermal_slowdown" in v11["clocks_throttle_reasons"]
    for version in (v11, v12):
        assert {"current_link_gen", "max_link_gen"} <= set(version["pcie_gen"])
        assert {"remapped_row_pending", "remapped_row_failure"} <= set(version["remapped_rows"])


@pytest.mark.parametrize("version", [11, 12])
def test_a_healthy_idle_a100_at_pcie_gen_1_is_healthy(version: int) -> None:
    # 535 on an idle A100: the link trains down to gen 1 of 4 to save power
    assert judged(xml(version), version) == {}


@pytest.mark.parametrize("version", [11, 12])
def test_a_thermal_slowdown_is_a_fault(version: int) -> None:
    assert judged(xml(version, active=("hw_thermal_slowdown",), gen=(4, 4)), version) == {"clock-slowdown": True}


def test_three_uncorrectable_sram_errors_are_a_fault() -> None:
    # 535 on an A100 gives one sram_uncorrectable counter (not parity/secded, as 580 on H100 does)
    assert judged(xml(sram_uncorrectable=3), 12) == {"ecc-volatile": True, "ecc-aggregate": True}
    _, [gpu] = parse_smi_xml(xml(sram_uncorrectable=3), "built")
    assert (gpu.ecc_uncorrectable_volatile, gpu.ecc_uncorrectable_aggregate) == (3, 3)


def test_the_pcie_link_is_judged_under_load_only() -> None:
    assert judged(xml(active=("sw_power_cap",), gen=(1, 4)), 12) == {"pcie-generation": True}
    assert judged(xml(active=("sw_power_cap",), gen=(4, 4), width=(8, 16)), 12) == {"pcie-width": True}
    assert judged(xml(gen=(1, 4), width=(8, 16)), 12) == {"pcie-width-idle": False}
    # idle not known: the link is not judged at all, the unknown is what is reported
    assert judged(xml(gen=(1, 4), reasons=False), 12) == {"unknown-clock-event-reasons": True}


def test_a_missing_element_is_unknown_never_healthy(tmp_path: Path) -> None:
    text = xml(ecc=False)
    assert judged(text, 12) == {"unknown-ecc-volatile": True, "unknown-ecc-aggregate": True}
    _, [gpu] = parse_smi_xml(text, "built")
    assert gpu.ecc_uncorrectable_volatile is None
    # reported distinctly: condition False, reason Unknown<Reading>, the elements looked for
    (tmp_path / "nvidia-smi-q.xml").write_text(text)
    findings = evaluate(read_dir(tmp_path), 1)
    report = agent.decide(agent.State("boot-1"), findings, "ok", "2026-11-23T10:00:00Z", "gpu-1")
    assert (report.condition["status"], report.condition["reason"]) == ("False", "UnknownEccVolatile")
    assert "no <ecc_errors><volatile>" in report.condition["message"]
    # a counter that is not a number (ECC off: N/A) is unknown too, not zero
    assert judged(xml().replace("<sram_uncorrectable>0<", "<sram_uncorrectable>N/A<")
                  .replace("<dram_uncorrectable>0<", "<dram_uncorrectable>N/A<"), 12) \
        == {"unknown-ecc-volatile": True, "unknown-ecc-aggregate": True}


@pytest.mark.parametrize("recording", ["nvidia-smi-q.xml", "under-load/nvidia-smi-q-under-load.xml"])
def test_the_real_h100_recordings_are_read_whole_and_stay_clean(recording: str) -> None:
    _, [gpu] = parse_smi_xml((RECORDED / recording).read_text(), recording)
    assert gpu.unknown == ()
    assert gpu.clock_event_reasons is not None and gpu.ecc_uncorrectable_volatile == 0
    assert gpu.remapped_rows_pending is False and gpu.remapped_rows_failure is False
    assert gpu_findings(gpu, thresholds()) == []


def test_every_required_reading_is_one_the_parser_can_report_unknown() -> None:
    required = set(thresholds()["readings"]["required"])
    text = xml(ecc=False, reasons=False).replace("<pci>", "<pcx>").replace("</pci>", "</pcx>")
    text = text.replace("<remapped_row_pending>No<", "<remapped_row_pending>?<")
    _, [gpu] = parse_smi_xml(text, "built")
    assert {reading for reading, _ in gpu.unknown} == required


def test_the_v12_schema_declares_the_fabric_state_and_status_the_agent_reads() -> None:
    # 535's DTD: <fabric> under <gpu>, with <state> and <status> (NVSwitch fabric registration)
    v12 = schema(12)
    assert "fabric" in v12["gpu"] and v12["fabric"] == ["state", "status"]
    assert "fabric" not in schema(11)["gpu"], "470 has none: read as no fabric, never waited for"
    _, [gpu] = parse_smi_xml(xml(11), "built")
    assert (gpu.fabric_state, gpu.fabric_status) == (None, None)


def test_a_passive_check_that_finds_the_fabric_no_longer_completed_is_a_fault() -> None:
    # an HGX H100 on 535: registered (Completed, Success) passes ...
    assert judged(xml(fabric=("Completed", "Success")), 12) == {}
    # ... Fabric Manager died or restarted: no longer Completed
    assert judged(xml(fabric=("In Progress", "N/A")), 12) == {"fabric-not-completed": True}
    assert judged(xml(fabric=("Not Started", "N/A")), 12) == {"fabric-not-completed": True}
    # ... a registration with an error status
    assert judged(xml(fabric=("Completed", "Insufficient Resources")), 12) == {"fabric-failed": True}
    # a GPU without NVSwitch (or before Hopper) has nothing to judge
    assert judged(xml(fabric=("N/A", "N/A")), 12) == {}
    assert judged(xml(fabric=("Not Supported", "N/A")), 12) == {}
