"""port-range: the shipped stacks' pool nodes keep their listeners and the NodePorts out of the
ephemeral port range; an override widening it (`1024 65535`) is a break naming the kubelet, the
node agents' metrics ports and the NodePorts, and reserving those ports in
ip_local_reserved_ports clears it."""

from __future__ import annotations

from kilonode.plan.wellknown import GPU_HEALTH_AGENT_METRICS_PORT, POD_TRAFFIC_METRICS_PORT
from kilonode.preflight import breaks, run
from kilonode.preflight.checks.port_range import port_range, reserved_ports
from kilonode.render.pool import SYSCTL_FILE
from tests.preflight.conftest import artefacts, inputs_of

CHECK = ["port-range"]
STACK = "research-7500"


def _widened(extra: str = "") -> dict[str, str]:
    files, _ = artefacts(STACK)
    for key in [k for k in files if k.endswith("/" + SYSCTL_FILE) and k.startswith("pool-")]:
        files[key] += f"net.ipv4.ip_local_port_range = 1024 65535\n{extra}"
    return files


def test_the_shipped_stacks_keep_listeners_out_of_the_ephemeral_range(shipped: str) -> None:
    assert breaks(run(inputs_of(shipped), CHECK)) == []


def test_a_range_from_1024_takes_the_kubelets_agents_and_nodeports() -> None:
    found = breaks(run(inputs_of(STACK, files=_widened()), CHECK))
    hosts = {f.where for f in found}
    assert "pool-h100-ib" in hosts and "pool-a100-ib.team-vision" in hosts
    [gpu] = [f for f in found if f.where == "pool-h100-ib"]
    assert "1024-65535" in gpu.what and "kubelet 10250" in gpu.what and "EADDRINUSE" in gpu.what
    assert f"gpu-health-agent-metrics {GPU_HEALTH_AGENT_METRICS_PORT}" in gpu.what
    assert f"pod-traffic {POD_TRAFFIC_METRICS_PORT}" in gpu.what and "NodePorts 30000-32767" in gpu.what
    assert "ssh 22" not in gpu.what  # below the range


def test_reserving_the_ports_clears_it() -> None:
    reserved = ("net.ipv4.ip_local_reserved_ports = 5473,6666,8085,9098-9100,9400,9479-9482,10248-10268,"
                "30000-32767\n")
    assert breaks(run(inputs_of(STACK, files=_widened(reserved)), CHECK)) == []


def test_reading_the_values() -> None:
    assert port_range("1024\t65535") == (1024, 65535) and port_range(None) == (32768, 60999)
    assert reserved_ports("8080, 10248-10250") == {8080, 10248, 10249, 10250}
