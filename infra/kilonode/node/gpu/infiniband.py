"""The node's InfiniBand ports as the kernel shows them in sysfs, against what the VM size has:
read by the GPU health agent (kilonode.gpu.agent) on pools whose config says
"expectInfiniband": {"ports": <count>, "gbps": <rate>} (the size catalogue's infinibandLinks),
written as infiniband.json (kilonode.gpu.readings) and judged by kilonode.gpu.rules.

Per port of every device under /sys/class/infiniband/<device>/ports/<n>/ it reads link_layer,
state, phys_state and rate. A port counts when its link layer is InfiniBand: Azure's
accelerated-networking NIC is an mlx5 RDMA device too, with an Ethernet link layer, and is
left out (named under "skipped"). A port is healthy when its state is ACTIVE and its rate at
least the size's. The kernel writes them as `<n>: <NAME>` ("4: ACTIVE", "1: DOWN", "2: INIT")
and `<Gb/s>[.5] Gb/sec (<width>X <speed>)` ("400 Gb/sec (4X NDR)") (Linux
drivers/infiniband/core/sysfs.c, state_show and rate_show).

Why: Azure's own node health checks require the same of every InfiniBand port of these sizes
(Azure/azurehpc-health-checks conf/nd96isr_h100_v5.conf lines 19-26, `check_hw_ib 400
mlx5_ib<n>:1` for n = 0..7; conf/nd96asr_v4.conf lines 27-34, `check_hw_ib 200 mlx5_ib<n>:1`,
with the accelerated-networking device `mlx5_an0` commented out at line 25); NHC's
check_hw_ib (mej/nhc scripts/lbnl_hw.nhc) passes a port only if its state is ACTIVE, its
physical state LinkUp and its rate the given one. A node short of a virtual function, or with
a port down or trained to a lower rate, otherwise joins a gang and NCCL runs on fewer or slower
links, while a job's bandwidth floor may still pass.

Standard library only: it runs under Debian's python3 on the node.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

SYS_INFINIBAND = Path("/sys/class/infiniband")
INFINIBAND = "infiniband"  # link_layer, lower-cased ("InfiniBand"; RoCE and Azure's AN NIC: "Ethernet")
ACTIVE = "ACTIVE"  # state's name ("4: ACTIVE")
RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")


def _attribute(port: Path, name: str) -> str | None:
    try:
        return (port / name).read_text().strip()
    except OSError:
        return None  # unknown: never healthy


def state_name(state: str | None) -> str | None:
    """'4: ACTIVE' -> 'ACTIVE'; None if unknown."""
    return state.partition(":")[2].strip() or state.strip() if state else None


def rate_gbps(rate: str | None) -> float | None:
    """'400 Gb/sec (4X NDR)' -> 400.0, '2.5 Gb/sec (1X SDR)' -> 2.5; None if unknown."""
    found = RATE.match(rate or "")
    return float(found.group(1)) if found else None


def read_ports(sysfs: Path = SYS_INFINIBAND) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """(the InfiniBand ports, {"<device>/<port>": link layer} of the others), in name order.
    Each port: device, port, linkLayer, state, physState, rate, as sysfs writes them."""
    ports: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    try:
        devices = sorted(p for p in sysfs.iterdir() if p.is_dir())
    except OSError:
        devices = []  # no RDMA device at all (ib_core not loaded, or none attached)
    for device in devices:
        try:
            numbers = sorted((p for p in (device / "ports").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
        except OSError:
            numbers = []
        for port in numbers:
            layer = _attribute(port, "link_layer")
            if (layer or "").lower() != INFINIBAND:
                skipped[f"{device.name}/{port.name}"] = layer or "unknown"
                continue
            ports.append({"device": device.name, "port": int(port.name), "linkLayer": layer,
                          "state": _attribute(port, "state"), "physState": _attribute(port, "phys_state"),
                          "rate": _attribute(port, "rate")})
    return ports, skipped


def reading(expected_ports: int, expected_gbps: int, sysfs: Path = SYS_INFINIBAND) -> dict[str, Any]:
    """infiniband.json: what the size has, and what sysfs shows now."""
    ports, skipped = read_ports(sysfs)
    return {"expected": {"ports": expected_ports, "gbps": expected_gbps}, "ports": ports, "skipped": skipped}


def port_name(port: dict[str, Any]) -> str:
    return f"{port.get('device')} port {port.get('port')}"


def problems(found: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(kind, port or None-ish summary, evidence) for each shortfall in an infiniband.json:
    "missing" once (fewer InfiniBand ports than the size has), "down" per port not ACTIVE,
    "slow" per active port below the size's rate. Pure; kilonode.gpu.rules words them."""
    expected = found.get("expected") or {}
    want_ports, want_gbps = int(expected.get("ports") or 0), float(expected.get("gbps") or 0)
    ports = [p for p in found.get("ports") or [] if isinstance(p, dict)]
    out: list[tuple[str, str, str]] = []
    if len(ports) < want_ports:
        present = ", ".join(port_name(p) for p in ports) or "none"
        skipped = sorted((found.get("skipped") or {}).items())
        others = "; not InfiniBand: " + ", ".join(f"{name} (link layer {layer})" for name, layer in skipped)
        out.append(("missing", f"{len(ports)} of {want_ports}", f"/sys/class/infiniband lists {len(ports)} "
                    f"InfiniBand port(s): {present}{others if skipped else ''}"))
    for port in ports:
        state, rate = port.get("state"), port.get("rate")
        evidence = (f"state {state or 'unknown'}, phys_state {port.get('physState') or 'unknown'}, "
                    f"rate {rate or 'unknown'}")
        if state_name(state) != ACTIVE:
            out.append(("down", port_name(port), evidence))
            continue
        gbps = rate_gbps(rate)
        if gbps is None or gbps < want_gbps:
            out.append(("slow", port_name(port), f"{evidence} (the size's links run at {want_gbps:g} Gb/s)"))
    return out


def ready(found: dict[str, Any]) -> bool:
    """Every port the size has is there, active, at its rate."""
    return not problems(found)
