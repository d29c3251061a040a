"""Per-pod traffic accounting on the booted node (kilonode.render.pod_traffic): two network
namespaces stand in for two pods, each on a veth whose host side is routed, as Azure CNI's
transparent mode plugs a pod (a host-side interface per pod, the host forwarding between them),
so their packets cross the node's forward hook as pods' do. A state file in azure-vnet's format
names them as pods of two namespaces, written where and how azure-vnet writes it (a temporary
file renamed over /run/azure-vnet.json); the path unit must pick it up; a known number of UDP
datagrams each way; the metrics on the socket must count exactly them under the right labels;
then one pod leaves the state file and its series and set elements must go.

First boot only, and only on the throwaway VM verify boots: it turns on IPv4 forwarding for a
moment and writes azure-vnet's state file, which on a live node (`--host`) belongs to azure-vnet.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import testinfra

from kilonode.image.probes import run_ok
from kilonode.node.pod_traffic import NFT
from kilonode.plan.wellknown import POD_TRAFFIC_METRICS_PORT
from kilonode.render import pod_traffic

# (netns, host-side veth, host address, pod address, namespace, pod name); the second name has
# the characters the exposition format must escape
PODS = (
    ("kn-pod-a", "kn-veth-a", "10.250.1.1", "10.250.1.2", "team-a", "trainer-0"),
    ("kn-pod-b", "kn-veth-b", "10.250.2.1", "10.250.2.2", "team-b", 'reader "1"\\x\ny'),
)
# datagrams each way: (from, to, count, payload bytes); each is payload + 8 (UDP) + 20 (IPv4)
# bytes on the wire, as the forward hook's counter sees it
FLOWS = ((0, 1, 100, 1000), (1, 0, 30, 400))
PORT = 9  # discard: each pod's own netns drops it silently, so no ICMP answer adds traffic
WAIT_S = 60  # the path unit reacts within a second; TCG is slow


def state_file(pods: tuple[tuple[str, str, str, str, str, str], ...]) -> str:
    """azure-vnet's state (azure-container-networking v1.6.21: network/manager.go, network.go,
    endpoint.go; the shape in kilonode/node/pod_traffic.py's docstring)."""
    endpoints = {
        f"{netns[-1]}0000000-eth0": {
            "Id": f"{netns[-1]}0000000-eth0", "IfName": "eth0", "HostIfName": veth,
            "IPAddresses": [{"IP": address, "Mask": "////AA=="}], "Gateways": [gateway],
            "NetworkNameSpace": f"/var/run/netns/{netns}", "ContainerID": netns,
            "PODName": pod, "PODNameSpace": namespace,
        }
        for netns, veth, gateway, address, namespace, pod in pods
    }
    return json.dumps({"Network": {"Version": "v1.6.21", "ExternalInterfaces": {"eth0": {
        "Name": "eth0", "Networks": {"azure": {"Id": "azure", "Mode": "transparent", "Endpoints": endpoints}}}}}})


def write_state(host: testinfra.host.Host, text: str) -> None:
    # as azure-vnet does it (store/json.go flush): a temporary file beside it, renamed over it
    data = base64.b64encode(text.encode()).decode()
    run_ok(host, f"echo {data} | base64 -d > /run/azure-vnet.json.kn && mv /run/azure-vnet.json.kn "
                 f"{pod_traffic.STATE_FILE}")


def wait_for_set(host: testinfra.host.Host, address: str, present: bool) -> None:
    """Until the path unit's sync has (or no longer has) `address` in the out set; no scrape
    happens meanwhile, so only the path unit can have done it."""
    test = "" if present else "!"
    run_ok(host, f"for i in $(seq {WAIT_S * 2}); do {test} {NFT} list set inet {pod_traffic.TABLE} pods_out_v4 "
                 f"| grep -qw '{address}' && exit 0; sleep 0.5; done; "
                 f"{NFT} list table inet {pod_traffic.TABLE}; exit 1")


def scrape(host: testinfra.host.Host) -> str:
    return run_ok(host, "python3 -c 'import urllib.request; print(urllib.request.urlopen("
                        f"\"http://127.0.0.1:{POD_TRAFFIC_METRICS_PORT}/metrics\", timeout=30).read().decode())'")


LINE = re.compile(r'^(?P<name>[a-z_]+)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)",?')


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of an exposition, label values unescaped (\\\\, \\", \\n)."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = LINE.match(line)
        assert match, f"not a sample line: {line!r}"
        labels = tuple((k, re.sub(r'\\(.)', lambda m: "\n" if m.group(1) == "n" else m.group(1), v))
                       for k, v in LABEL.findall(match.group("labels") or ""))
        samples[(match.group("name"), labels)] = float(match.group("value"))
    return samples


def series(metric: str, pod: int, direction: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return (metric, (("namespace", PODS[pod][4]), ("pod", PODS[pod][5]), ("direction", direction)))


SETUP = "\n".join([
    "set -eu",
    "sysctl -n net.ipv4.ip_forward > /run/kn-ip-forward",
    *(line for netns, veth, gateway, address, _ns, _pod in PODS for line in (
        f"ip netns add {netns}",
        f"ip link add {veth} type veth peer name eth0 netns {netns}",
        f"ip addr add {gateway}/24 dev {veth}",
        f"ip link set {veth} up",
        f"ip -n {netns} link set lo up",
        f"ip -n {netns} addr add {address}/24 dev eth0",
        f"ip -n {netns} link set eth0 up",
        f"ip -n {netns} route add default via {gateway}",
        f"printf 'table inet kn {{\\n chain input {{\\n type filter hook input priority 0; policy accept;\\n"
        f" udp dport {PORT} drop\\n }}\\n}}\\n' | ip netns exec {netns} {NFT} -f -",
    )),
    "sysctl -qw net.ipv4.ip_forward=1",
])
CLEANUP = "; ".join([
    *(f"ip netns del {netns} 2>/dev/null" for netns, *_ in PODS),
    f"rm -f {pod_traffic.STATE_FILE}",
    "systemctl start kilonode-pod-traffic.service",
    "[ -s /run/kn-ip-forward ] && sysctl -qw net.ipv4.ip_forward=$(cat /run/kn-ip-forward)",
    "rm -f /run/kn-ip-forward",
    "true",
])


def send(source: int, target: int, count: int, size: int) -> str:
    code = (f"import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
            f"[s.sendto(b'x' * {size}, ('{PODS[target][3]}', {PORT})) for _ in range({count})]")
    return f"ip netns exec {PODS[source][0]} python3 -c \"{code}\""


@pytest.fixture(scope="module")
def accounting(host: testinfra.host.Host, ssh: dict[str, Any]) -> Iterator[dict[str, str]]:
    """The scenario, run once: the metrics after the traffic and after pod A left."""
    if not ssh.get("disposable"):
        pytest.skip("writes azure-vnet's state file and turns on forwarding: only on the VM verify boots")
    try:
        run_ok(host, f"echo {base64.b64encode(SETUP.encode()).decode()} | base64 -d | bash")
        write_state(host, state_file(PODS))
        for _netns, _veth, _gw, address, _ns, _pod in PODS:
            wait_for_set(host, address, present=True)
        before = scrape(host)
        for source, target, count, size in FLOWS:
            run_ok(host, send(source, target, count, size))
        after = scrape(host)
        write_state(host, state_file(PODS[1:]))
        wait_for_set(host, PODS[0][3], present=False)
        left = scrape(host)
        table = run_ok(host, f"{NFT} list table inet {pod_traffic.TABLE}")
        yield {"before": before, "after": after, "left": left, "table": table}
    finally:
        host.run(CLEANUP)


@pytest.mark.persistent
def test_pod_traffic_units_run(host: testinfra.host.Host) -> None:
    for unit in ("kilonode-pod-traffic-table.service", "kilonode-pod-traffic.path", "kilonode-pod-traffic.socket"):
        assert host.run(f"systemctl is-active {unit}").stdout.strip() == "active", unit


def test_forwarded_traffic_is_counted_under_each_pods_namespace_and_name(accounting: dict[str, str]) -> None:
    before, after = parse(accounting["before"]), parse(accounting["after"])
    for source, target, count, size in FLOWS:
        for pod, direction in ((source, "out"), (target, "in")):
            packets = series("kilonode_pod_network_packets_total", pod, direction)
            octets = series("kilonode_pod_network_bytes_total", pod, direction)
            assert after[packets] - before[packets] == count, (packets, accounting["after"])
            assert after[octets] - before[octets] == count * (size + 28), (octets, accounting["after"])
    assert after[("kilonode_pod_network_addresses", ())] == len(PODS)
    assert after[("kilonode_pod_network_state_readable", ())] == 1


def test_a_pod_gone_from_the_state_file_loses_its_series_and_set_elements(accounting: dict[str, str]) -> None:
    left = parse(accounting["left"])
    names = {dict(labels).get("pod") for _metric, labels in left}
    assert PODS[0][5] not in names and PODS[1][5] in names
    assert PODS[0][3] not in accounting["table"] and PODS[1][3] in accounting["table"]
    # the pod that stayed keeps its count
    assert left[series("kilonode_pod_network_bytes_total", 1, "out")] == \
        parse(accounting["after"])[series("kilonode_pod_network_bytes_total", 1, "out")]
