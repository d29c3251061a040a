"""The node firewall (kilonode.render.node_ports): every pool role's user-data loads it before the
kubelet and the sockets, which require it; its ruleset passes nft's own parser; and, loaded into a
network namespace wired as Azure CNI wires a node (transparent mode: a pod behind its own azv*
interface, the virtual network behind eth0), it really drops a pod's and another pool's
connection to a guarded port and admits the scraper's and the node's own.

Also here, because they are the other half of keeping the node's ports to their callers: what is
bound to loopback (kube-proxy's metrics and health, the runtime's streaming server)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from ipaddress import IPv4Network

import pytest

from kilonode.k8s.network_policy import PROMETHEUS_PORT
from kilonode.k8s.proxy import proxy_config
from kilonode.plan import ClusterPlan
from kilonode.plan.listeners import firewalled_ports, listener
from kilonode.render import node_ports
from kilonode.render.files import USER_DATA
from kilonode.render.pool import cri_dockerd_flags
from tests import shared

# Written by hand from the catalogue's sources, not read from it: the unauthenticated host ports
# of a pool's nodes (the per-pod traffic socket everywhere, the GPU health agent's on GPU pools,
# the autoscaler's host-network metrics on the controller pools).
POD_TRAFFIC, GPU_AGENT, AUTOSCALER = 9480, 9481, 8085
NODE_EXPORTER, DCGM_EXPORTER = 9100, 9400  # upstream's default ports (catalog/listeners.yaml)


def pool_roles(stack: str) -> Iterator[tuple[str, dict[str, str]]]:
    for host, files in shared.rendered(stack).items():
        if host.startswith("pool-"):
            yield host, {path: f.content for path, f in files.items()}


@pytest.mark.parametrize("stack", shared.SHIPPED_STACKS)
def test_every_pool_role_loads_the_firewall_before_the_kubelet_and_the_sockets(stack: str) -> None:
    for role, files in pool_roles(stack):
        data = shared.load_yaml(files[USER_DATA])
        written = {f["path"]: f["content"] for f in data["write_files"]}
        assert written[f"/{node_ports.RULESET}"] == files[node_ports.RULESET]
        assert written[f"/{node_ports.UNIT}"] == files[node_ports.UNIT]
        unit = files[node_ports.UNIT]
        assert f"ExecStart=/usr/sbin/nft -f /{node_ports.RULESET}" in unit and "ConditionPathExists" not in unit
        assert "DefaultDependencies=no" in unit and "WantedBy=sysinit.target" in unit
        [start] = [cmd for cmd in data["runcmd"] if cmd[:3] == ["systemctl", "enable", "--now"]
                   and "kubelet.service" in cmd]
        assert start.index(node_ports.UNIT_NAME) < start.index("kubelet.service"), role
        sockets = [p for p in files if p.endswith(".socket")]
        assert sockets, role
        for path in ["etc/systemd/system/kubelet.service", *sockets]:
            lines = files[path].splitlines()
            assert f"Requires={node_ports.UNIT_NAME}" in lines and f"After={node_ports.UNIT_NAME}" in lines, path


@pytest.mark.parametrize("stack", shared.SHIPPED_STACKS)
def test_the_guarded_ports_are_every_unauthenticated_host_port_of_the_pool(stack: str) -> None:
    plan = shared.plan(stack)
    controllers = {p.name for p in plan.controller_pools}
    for pool in plan.node_pools:
        # the exporters' host-network pods (kilonode.k8s.exporters): node-exporter everywhere, dcgm-exporter
        # on the GPU pools
        pods = {NODE_EXPORTER} | ({DCGM_EXPORTER} if pool.gpus_per_node else set())
        expected = {POD_TRAFFIC} | ({GPU_AGENT} if pool.gpus_per_node else set()) | (
            {AUTOSCALER} if pool.name in controllers else set()) | pods
        assert set(firewalled_ports(plan, pool)) == expected, pool.name
        expected -= pods
        # and each one really listens there: a socket unit or the autoscaler's host-network port
        listening = {int(line.rpartition("=")[2].rpartition(":")[2])
                     for path, f in shared.rendered(stack)[pool.role()].items() if path.endswith(".socket")
                     for line in f.content.splitlines() if line.startswith("ListenStream=")}
        assert expected - {AUTOSCALER} <= listening, pool.name


def test_prometheus_keeps_its_port_to_the_apiservers_and_its_reserved_pool(plans: dict[str, ClusterPlan]) -> None:
    assert listener("prometheus").port == PROMETHEUS_PORT  # the catalogue's and the pod's
    plan = plans["research-7500"]
    pools = {p.name: node_ports.node_ports(plan, p) for p in plan.node_pools}
    assert pools["monitoring"].prometheus_port == 9090 and pools["monitoring"].scraper_here
    assert pools["monitoring"].prometheus_from == (IPv4Network("10.0.0.0/24"), IPv4Network("10.0.2.64/28"))
    assert all(p.prometheus_port is None and not p.scraper_here for name, p in pools.items() if name != "monitoring")
    # local: Prometheus on the one pool users' pods share; no rule would tell theirs from its
    [local] = [node_ports.node_ports(plans["local"], p) for p in plans["local"].node_pools]
    assert local.prometheus_port is None and local.scraper_here


def test_every_ruleset_passes_nfts_own_parser() -> None:
    if not shutil.which("nft"):
        pytest.fail("nft missing: run `make setup` (installs nftables, .ci/debian-packages.txt)")
    texts = {text for stack in shared.SHIPPED_STACKS for _, files in pool_roles(stack)
             for text in [files[node_ports.RULESET]]}
    texts.add(node_ports.ruleset(node_ports.NodePorts((), None, False, None, ())))  # nothing to guard
    for text in texts:
        check = subprocess.run(["nft", "-c", "-f", "-"], input=text, capture_output=True, text=True, timeout=30,
                               check=False)
        assert check.returncode == 0 or "Operation not permitted" in check.stderr, (check.stderr, text)
    broken = next(t for t in sorted(texts) if "tcp dport {" in t).replace("tcp dport {", "tcp dprt {", 1)
    check = subprocess.run(["nft", "-c", "-f", "-"], input=broken, capture_output=True, text=True, timeout=30,
                           check=False)
    assert check.returncode != 0


def test_the_node_firewall_refuses_what_nft_would_not_read() -> None:
    with pytest.raises(ValueError):
        node_ports.NodePorts((0,), None, False, None, ())
    with pytest.raises(ValueError):
        node_ports.NodePorts((9480,), None, True, 9090, ())


def test_what_no_one_off_the_node_reads_is_bound_to_loopback(plans: dict[str, ClusterPlan]) -> None:
    # kube-proxy: no scrape job reads its metrics; Azure probes 10256 only in the `shared` mode
    config = proxy_config()
    assert config["metricsBindAddress"] == "127.0.0.1:10249" and config["healthzBindAddress"] == "127.0.0.1:10256"
    # cri-dockerd's streams: config/options.go `streaming-bind-addr` (Mirantis/cri-dockerd 665a141d, release/0.3)
    pool = next(p for p in plans["research-7500"].node_pools if p.runtime == "docker")
    assert ("streaming-bind-addr", "127.0.0.1") in cri_dockerd_flags(pool)
    # containerd's: the CRI plugin's stream_server_address
    files = shared.rendered("research-2500")["pool-nc-a100"]
    cri = tomllib.loads(files["etc/containerd/config.toml"].content)["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["stream_server_address"] == "127.0.0.1"


# --- the ruleset on a wired node, for real -------------------------------------------------------

SERVER = textwrap.dedent("""
    import selectors, socket, sys, time
    selector = selectors.DefaultSelector()
    for port in map(int, sys.argv[1:]):
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port)); s.listen(); selector.register(s, selectors.EVENT_READ)
    print("ready", flush=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for key, _ in selector.select(timeout=1):
            conn, _ = key.fileobj.accept(); conn.sendall(b"ok"); conn.close()
""")
PROBE = textwrap.dedent("""
    import json, socket, sys
    answers = []
    for source, target, port in json.loads(sys.argv[1]):
        try:
            with socket.create_connection((target, port), timeout=1.5, source_address=(source, 0)) as s:
                answers.append(s.recv(2) == b"ok")
        except OSError:
            answers.append(False)
    print(json.dumps(answers))
""")


class Node:
    """Three network namespaces: a pool node (eth0 to the virtual network, azv* to one pod), its
    pod, and the rest of the virtual network (holding the other hosts' addresses)."""

    def __init__(self, tag: str, node_ip: str, pod_ip: str, others: list[str]) -> None:
        self.names = {role: f"kn{role}{tag}" for role in ("node", "pod", "vnet")}
        self.node_ip, self.pod_ip, self.others = node_ip, pod_ip, others
        self.servers: list[subprocess.Popen[str]] = []

    def run(self, where: str, *command: str, stdin: str | None = None) -> str:
        done = subprocess.run(["ip", "netns", "exec", self.names[where], *command], input=stdin,
                              capture_output=True, text=True, timeout=60, check=True)
        return done.stdout

    def wire(self) -> None:
        node, pod, vnet = self.names["node"], self.names["pod"], self.names["vnet"]
        for name in self.names.values():
            subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
        steps = [
            ["ip", "link", "add", "eth0", "netns", node, "type", "veth", "peer", "vnet0", "netns", vnet],
            ["ip", "link", "add", "azv0123456789a", "netns", node, "type", "veth", "peer", "eth0", "netns", pod],
        ]
        for step in steps:
            subprocess.run(step, check=True, timeout=30)
        for where in ("node", "pod", "vnet"):
            self.run(where, "ip", "link", "set", "lo", "up")
        self.run("node", "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")  # this namespace's own
        self.run("node", "ip", "link", "set", "eth0", "up")
        self.run("node", "ip", "link", "set", "azv0123456789a", "up")
        self.run("node", "ip", "addr", "add", f"{self.node_ip}/32", "dev", "eth0")
        self.run("node", "ip", "route", "add", "10.0.0.0/16", "dev", "eth0")
        self.run("node", "ip", "route", "add", f"{self.pod_ip}/32", "dev", "azv0123456789a")
        self.run("vnet", "ip", "link", "set", "vnet0", "up")
        for address in self.others:
            self.run("vnet", "ip", "addr", "add", f"{address}/32", "dev", "vnet0")
        self.run("vnet", "ip", "route", "add", f"{self.node_ip}/32", "dev", "vnet0")
        self.run("vnet", "ip", "route", "add", f"{self.pod_ip}/32", "via", self.node_ip, "dev", "vnet0", "onlink")
        # Azure CNI's transparent mode: the pod's default gateway 169.254.1.1 is its host-side
        # interface, by a permanent neighbour entry (azure-container-networking, transparent endpoint)
        mac = self.run("node", "ip", "-br", "link", "show", "azv0123456789a").split()[2]
        self.run("pod", "ip", "link", "set", "eth0", "up")
        self.run("pod", "ip", "addr", "add", f"{self.pod_ip}/32", "dev", "eth0")
        self.run("pod", "ip", "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link")
        self.run("pod", "ip", "neigh", "add", "169.254.1.1", "lladdr", mac, "dev", "eth0", "nud", "permanent")
        self.run("pod", "ip", "route", "add", "default", "via", "169.254.1.1", "dev", "eth0")

    def serve(self, where: str, ports: list[int]) -> None:
        server = subprocess.Popen(["ip", "netns", "exec", self.names[where], sys.executable, "-c", SERVER,
                                   *map(str, ports)], stdout=subprocess.PIPE, text=True)
        self.servers.append(server)
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"

    def probe(self, where: str, probes: list[tuple[str, str, int]]) -> list[bool]:
        import json
        return list(json.loads(self.run(where, sys.executable, "-c", PROBE, json.dumps(probes))))

    def remove(self) -> None:
        for server in self.servers:
            server.kill()
            server.wait(timeout=30)
        for name in self.names.values():
            subprocess.run(["ip", "netns", "del", name], check=False, timeout=30)


@pytest.fixture
def wired() -> Iterator[list[Node]]:
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("nft"):
        pytest.skip("needs root, iproute2 and nftables (make setup installs them; CI runs as root)")
    nodes: list[Node] = []
    yield nodes
    for node in nodes:
        node.remove()


@pytest.mark.slow
def test_on_a_system_node_a_pod_and_another_pool_are_dropped_and_the_scraper_admitted(wired: list[Node]) -> None:
    files = dict(pool_roles("research-7500"))["pool-system"]
    # the system node 10.0.2.4 and a pod of it; Prometheus's pod (monitoring, 10.0.2.64/28), a GPU
    # node's pod (a100-ib, 10.0.128.0/17) and an apiserver (10.0.0.10) elsewhere in the VNet
    node = Node(f"s{os.getpid()}", "10.0.2.4", "10.0.2.5", ["10.0.2.70", "10.0.128.10", "10.0.0.10"])
    wired.append(node)
    node.wire()
    node.run("node", "nft", "-f", "-", stdin=files[node_ports.RULESET])
    node.serve("node", [POD_TRAFFIC, AUTOSCALER, 10250])
    guarded, open_port = [POD_TRAFFIC, AUTOSCALER], 10250  # the kubelet's: authenticated, not guarded
    from_pod = node.probe("pod", [("10.0.2.5", "10.0.2.4", p) for p in [*guarded, open_port]])
    assert from_pod == [False, False, True]
    from_vnet = node.probe("vnet", [(source, "10.0.2.4", p) for source in ("10.0.2.70", "10.0.128.10", "10.0.0.10")
                                    for p in [*guarded, open_port]])
    assert from_vnet == [True, True, True,  # the scraper
                         False, False, True,  # another pool's pod
                         False, False, True]  # the control plane
    assert node.probe("node", [("10.0.2.4", "10.0.2.4", p) for p in guarded]) == [True, True]  # over lo


@pytest.mark.slow
def test_on_the_prometheus_node_its_port_admits_the_apiservers_and_not_another_pool(wired: list[Node]) -> None:
    files = dict(pool_roles("research-7500"))["pool-monitoring"]
    # the monitoring node 10.0.2.68 and its Prometheus pod 10.0.2.69; a system pod of the same
    # reserved pool on another node (10.0.2.70), a GPU node's pod, an apiserver
    node = Node(f"m{os.getpid()}", "10.0.2.68", "10.0.2.69", ["10.0.2.70", "10.0.128.10", "10.0.0.10"])
    wired.append(node)
    node.wire()
    node.run("node", "nft", "-f", "-", stdin=files[node_ports.RULESET])
    node.serve("node", [POD_TRAFFIC])
    node.serve("pod", [PROMETHEUS_PORT])
    # Prometheus scrapes its own node through its pod interface: it is the scraper
    assert node.probe("pod", [("10.0.2.69", "10.0.2.68", POD_TRAFFIC)]) == [True]
    queries = node.probe("vnet", [(source, "10.0.2.69", PROMETHEUS_PORT)
                                  for source in ("10.0.2.70", "10.0.128.10", "10.0.0.10")])
    assert queries == [True, False, True]  # its reserved pool, not another pool's pod, the apiservers' proxy
    assert node.probe("vnet", [("10.0.128.10", "10.0.2.68", POD_TRAFFIC)]) == [False]


def test_the_netns_tests_wire_a_node_as_the_rendered_ruleset_expects() -> None:
    """The interface names the lab gives its node are those the ruleset matches."""
    text = dict(pool_roles("research-7500"))["pool-system"][node_ports.RULESET]
    assert f'iifname "{node_ports.POD_INTERFACES}"' in text and node_ports.POD_INTERFACES == "azv*"
