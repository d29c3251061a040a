"""listeners: every port the cluster's machines listen on without authenticating a caller is
reachable only from its scraper's source, and never from a pod address of a pool where users'
pods run.

The listeners are found in the artefacts, each matched to its row of the catalogue
(kilonode.catalog listeners.yaml: who must reach it, whether it authenticates, the address it
binds):
- every host role's systemd socket units (ListenStream: kilonode's metrics sockets), etcd's
  --listen-client-urls, --listen-peer-urls and --listen-metrics-urls, the control plane's
  --bind-address and --secure-port, the kubelet's address and health address, cri-dockerd's
  --streaming-bind-addr and containerd's stream_server_address;
- from the recorded graph, kube-proxy's metricsBindAddress and healthzBindAddress (its ConfigMap)
  and every host-network workload's declared ports.
A socket or host-network port no row describes is a break (no one has said who may reach it),
and so is a listener bound wider than its row (every address where the row says loopback or the
host's own address).

Then each unauthenticated listener that is not on loopback is judged where it lives:
- etcd members and apiserver VMs: every pool's whole subnet (its pods' addresses, Azure CNI)
  against the NSGs in front of the host, in evaluation order (deployer_path `admitted_parts`, the
  evaluation `connections` and `scrape-path` use). A pool other than the Prometheus pool admitted
  is a break;
- pool nodes: the node firewall (kilonode.render.node_ports) must be in the role's user-data,
  loaded by its unit, started by cloud-init, and required by the kubelet and by every socket that
  listens on a port it guards; its input chain is evaluated for a new connection (kilonode.
  preflight.nft) and must admit the port from the node itself (lo) and the Prometheus pool's
  subnet, and drop it from a pod on the node (on any other pool than Prometheus's) and from every
  other pool's subnet. Prometheus's own port on a reserved Prometheus pool: its forward chain must
  drop it from every other pool's pods and admit the control plane.

The scraper's source means the scraper only on a reserved pool (kilonode.plan.listeners): a
Prometheus pool where users' pods can run is a warning (what they reach is listed), and the
reserved pools' admission policy must be in the graph, bound to deny; a workload outside the
system namespaces that tolerates a reserved pool's taints is a break (the policy refuses its pods).

What no offline check shows: a listener started by hand or by a workload that declares no port,
and pods' own ports (NetworkPolicy's, not the host's).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, ip_address
from typing import Any
from urllib.parse import urlsplit

import yaml

from kilonode.k8s.reserved_pools import POLICY_NAME
from kilonode.plan import defaults
from kilonode.plan.listeners import (
    PlannedListener,
    keeping_taints,
    listeners,
    pool_hosts,
    prometheus_pool,
    reserved_pools,
    scraper_subnet,
    users_run_on,
)
from kilonode.plan.model import ClusterPlan, NodePoolPlan
from kilonode.preflight import nft
from kilonode.preflight.checks.deployer_path import NetworkGraph, admitted_parts
from kilonode.preflight.checks.scrape_path import nsgs_of
from kilonode.preflight.model import Finding, Inputs
from kilonode.preflight.nodes import KUBELET_CONFIG, KUBELET_UNIT, flags_of, unit_exec_args
from kilonode.preflight.placement import Taint, pod_tolerations, tolerates
from kilonode.render import node_ports
from kilonode.render.files import USER_DATA
from kilonode.yamlio import load_yaml

NAME = "listeners"
TITLE = "every unauthenticated listening port is reachable only from its scraper, never from users' pods"

LOOPBACK = IPv4Network("127.0.0.0/8")
ANY = "all"  # a listener on every address
# A pod's host-side interface on the node (Azure CNI), the node's own NIC, and loopback.
POD_IF, NIC_IF, LOOPBACK_IF = f"{defaults.KUBE_PROXY_POD_INTERFACE_PREFIX}0123456789a", "eth0", "lo"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
POLICY = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
BINDING = f"{POLICY}Binding"

@dataclass(frozen=True)
class Found:
    """A listener found in the artefacts: the host role, the address (an IPv4 address, or ANY),
    the port, where it was read, and its catalogue row (None: no row describes it)."""

    host: str
    address: str
    port: int
    where: str
    row: PlannedListener | None


def check(inputs: Inputs) -> list[Finding]:
    found = [f for host in inputs.hosts() for f in _found(inputs, host)] + _found_in_graph(inputs)
    findings = [*_unknown_and_wide(found), *_nsg_findings(inputs, found), *_firewall_findings(inputs, found),
                *_reserved_findings(inputs)]
    return findings


# --- finding the listeners ----------------------------------------------------------------------

def _kinds(plan: ClusterPlan, host: str) -> set[str]:
    if host.startswith("etcd-"):
        return {"etcd"}
    if host.startswith("apiserver-"):
        return {"control-plane"}
    pool = _pool_of(plan, host)
    return set(pool_hosts(plan, pool)) if pool is not None else set()


def _pool_of(plan: ClusterPlan, host: str) -> NodePoolPlan | None:
    return next((p for p in plan.node_pools if host == p.role() or host.startswith(p.role() + ".")), None)


def _row(plan: ClusterPlan, host: str, port: int, listener_id: str | None = None) -> PlannedListener | None:
    kinds = _kinds(plan, host)
    return next((r for r in listeners() if (r.id == listener_id if listener_id else r.port == port)
                 and kinds & set(r.hosts)), None)


def _address(text: str) -> str:
    """A bind address as written -> an IPv4 address, or ANY (empty, 0.0.0.0, [::])."""
    host = text.strip("[]")
    if host in ("", "0.0.0.0", "::", "*"):
        return ANY
    return "127.0.0.1" if host == "localhost" else host


def _split(text: str) -> tuple[str, int]:
    """`addr:port`, `:port` or `port` -> (address, port)."""
    host, sep, port = text.rpartition(":")
    return (_address(host) if sep else ANY), int(port)


def _found(inputs: Inputs, host: str) -> Iterator[Found]:
    files, plan = inputs.host_files(host), inputs.plan
    for path, text in files.items():
        if path.endswith(".socket"):
            for number, line in enumerate(text.splitlines(), 1):
                if line.startswith("ListenStream=") and not line.removeprefix("ListenStream=").startswith("/"):
                    address, port = _split(line.removeprefix("ListenStream="))
                    yield Found(host, address, port, f"{path}:{number}", _row(plan, host, port))
        elif path.endswith(".service") and "ExecStart=" in text:
            yield from _from_flags(plan, host, path, flags_of(unit_exec_args(text)))
    if KUBELET_CONFIG in files:
        yield from _from_kubelet(plan, host, load_yaml(files[KUBELET_CONFIG]) or {})
    if "etc/containerd/config.toml" in files:
        cri = tomllib.loads(files["etc/containerd/config.toml"]).get("plugins", {}).get("io.containerd.grpc.v1.cri", {})
        yield Found(host, _address(str(cri.get("stream_server_address", ""))), 0,
                    "etc/containerd/config.toml stream_server_address", _row(plan, host, 0, "containerd-streaming"))


def _from_flags(plan: ClusterPlan, host: str, path: str, flags: Mapping[str, str]) -> Iterator[Found]:
    where = path.rpartition("/")[2]
    for flag in ("listen-client-urls", "listen-peer-urls", "listen-metrics-urls"):
        for url in filter(None, flags.get(flag, "").split(",")):
            parts = urlsplit(url)
            port = parts.port or 0
            yield Found(host, _address(parts.hostname or ""), port, f"{where} --{flag}", _row(plan, host, port))
    if "secure-port" in flags:
        port = int(flags["secure-port"])
        yield Found(host, _address(flags.get("bind-address", "")), port, f"{where} --secure-port",
                    _row(plan, host, port))
    if where == "cri-docker.service":
        yield Found(host, _address(flags.get("streaming-bind-addr", "")), 0, f"{where} --streaming-bind-addr",
                    _row(plan, host, 0, "cri-dockerd-streaming"))


def _from_kubelet(plan: ClusterPlan, host: str, config: Mapping[str, Any]) -> Iterator[Found]:
    # the defaults where the file leaves a field out (kubernetes/kubelet config/v1beta1/types.go)
    port = int(config.get("port", 10250))
    yield Found(host, _address(str(config.get("address", ""))), port, KUBELET_CONFIG, _row(plan, host, port))
    health = int(config.get("healthzPort", 10248))
    if health:
        yield Found(host, _address(str(config.get("healthzBindAddress", "127.0.0.1"))), health,
                    f"{KUBELET_CONFIG} healthzBindAddress", _row(plan, host, health, "kubelet-healthz"))
    if int(config.get("readOnlyPort", 0)):
        port = int(config["readOnlyPort"])
        yield Found(host, ANY, port, f"{KUBELET_CONFIG} readOnlyPort", _row(plan, host, port, "kubelet-read-only"))


def _found_in_graph(inputs: Inputs) -> list[Found]:
    """kube-proxy's two listeners and every host-network workload's ports, on each pool role
    whose kinds the row names (the graph says which pods, not which nodes)."""
    roles = [h for h in inputs.hosts() if _pool_of(inputs.plan, h) is not None]
    found: list[Found] = []
    for config_map in inputs.of_type(CONFIG_MAP):
        meta = config_map.inputs.get("metadata") or {}
        text = (config_map.inputs.get("data") or {}).get("config.conf")
        if meta.get("name") != "kube-proxy" or not isinstance(text, str):
            continue
        config = load_yaml(text) or {}
        # kube-proxy's defaults where the config leaves them out (catalog/listeners.yaml)
        for field, default, row in (("metricsBindAddress", "127.0.0.1:10249", "kube-proxy-metrics"),
                                    ("healthzBindAddress", "0.0.0.0:10256", "kube-proxy-healthz")):
            address, port = _split(str(config.get(field) or default))
            found += [Found(h, address, port, f"ConfigMap kube-system/kube-proxy {field}",
                            _row(inputs.plan, h, port, row)) for h in roles]
    for workload in inputs.workloads():
        spec = ((workload.inputs.get("spec") or {}).get("template") or {}).get("spec") or {}
        if not spec.get("hostNetwork"):
            continue
        for container in spec.get("containers") or []:
            for port in container.get("ports") or []:
                number = int(port.get("hostPort") or port.get("containerPort") or 0)
                rows = {h: _row(inputs.plan, h, number) for h in roles}
                where = f"{workload.describe()} port {number}"
                found += [Found(h, ANY, number, where, row) for h, row in rows.items() if row is not None]
                if not any(rows.values()):
                    found.append(Found(roles[0] if roles else "pools", ANY, number, where, None))
    return found


# --- what no row describes, and what binds wider than its row --------------------------------------

def _unknown_and_wide(found: list[Found]) -> list[Finding]:
    findings: dict[tuple[str, str], Finding] = {}
    for f in found:
        if f.row is None:
            findings.setdefault(("unknown", f"{f.where}"), Finding(
                NAME, "break", f.host,
                f"{f.where} listens on TCP {f.port} ({'every address' if f.address == ANY else f.address}), and no "
                "row of the listener catalogue says who may reach it or whether it authenticates anyone",
                "add its row to catalog/listeners.yaml (program, hosts, bind, auth, reachedBy, guard, source) and "
                "keep it to those callers, or stop it listening"))
        elif _wider(f):
            findings.setdefault(("wide", f"{f.row.id}:{f.where}"), Finding(
                NAME, "break", f.host,
                f"{f.where}: {f.row.program} listens on {'every address' if f.address == ANY else f.address}:"
                f"{f.port}, where its catalogue row binds {f.row.bind}: "
                + ("it authenticates no one, so every pod that reaches the host reads it" if not f.row.authenticated
                   else "a wider bind than upstream's own"),
                f"bind it to {'127.0.0.1' if f.row.bind == 'loopback' else 'the host address'} as the catalogue "
                f"row {f.row.id} says (its source names the flag or field)"))
    return list(findings.values())


def _wider(f: Found) -> bool:
    assert f.row is not None
    if f.row.bind == "loopback":
        return not (f.address != ANY and ip_address(f.address) in LOOPBACK)
    return f.row.bind == "host" and f.address == ANY


def _exposed(found: list[Found], kinds: set[str]) -> list[Found]:
    """The unauthenticated listeners off loopback, on hosts of these kinds."""
    return [f for f in found if f.row is not None and not f.row.authenticated and f.row.bind != "loopback"
            and not (f.address != ANY and ip_address(f.address) in LOOPBACK) and kinds & set(f.row.hosts)]


# --- etcd members and apiserver VMs: the NSGs ----------------------------------------------------

def _host_ip(plan: ClusterPlan, host: str) -> IPv4Address | None:
    for member in (m for c in plan.etcd_clusters for m in c.members):
        if member.name == host:
            return IPv4Address(str(member.ip))
    return next((IPv4Address(str(i.ip)) for i in plan.control_plane.instances if i.name == host), None)


def _nsg_findings(inputs: Inputs, found: list[Found]) -> list[Finding]:
    plan, graph = inputs.plan, NetworkGraph(inputs)
    vnet = [IPv4Network(plan.network.vnet_cidr)]
    scraper = prometheus_pool(plan)
    reached: dict[tuple[str, int, str, str], list[str]] = {}  # (pool, port, program, rule) -> hosts
    for f in _exposed(found, {"etcd", "control-plane"}):
        target = IPv4Address(f.address) if f.address != ANY else _host_ip(plan, f.host)
        if target is None:
            continue
        nsgs = nsgs_of(graph, target)
        for pool in plan.node_pools:
            parts: list[tuple[IPv4Network, str]] = [(IPv4Network(pool.subnet), "")]
            for nsg in nsgs:
                rules = nsg.inputs.get("securityRules") or []
                parts = [(part, rule) for net, _ in parts
                         for part, rule in admitted_parts(rules, net, [target], f.port, vnet)]
            if parts and (scraper is None or pool.name != scraper.name):
                assert f.row is not None
                key = (pool.name, f.port, f.row.program, parts[0][1])
                reached.setdefault(key, []).append(f"{f.host} ({target})")
    return [Finding(
        NAME, "break", f"pool-{pool} -> TCP {port}",
        f"every pod of pool {pool} can reach {program} on {', '.join(hosts)}, which authenticates no one: the NSG "
        f"admits the pool's subnet by rule {rule}, and it is not the cluster's Prometheus",
        f"admit TCP {port} from the Prometheus pool's subnet alone (kilonode.azure.network, the `-from-monitoring` "
        "rules), above every deny")
        for (pool, port, program, rule), hosts in reached.items()]


# --- pool nodes: the node firewall ---------------------------------------------------------------

def _user_data_files(files: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """What the role's nodes are given: written path -> content, and the units cloud-init starts."""
    try:
        data = load_yaml(files.get(USER_DATA, "")) or {}
    except yaml.YAMLError:
        data = {}
    data = data if isinstance(data, dict) else {}
    written = {str(f.get("path", "")).lstrip("/"): str(f.get("content", ""))
               for f in data.get("write_files") or [] if isinstance(f, Mapping)}
    started = [w for cmd in data.get("runcmd") or [] if isinstance(cmd, list)
               and cmd[:3] == ["systemctl", "enable", "--now"] for w in cmd[3:]]
    return written, started


def _loading_problems(written: Mapping[str, str], started: list[str], sockets: list[str]) -> list[str]:
    problems = []
    if node_ports.RULESET not in written:
        problems.append(f"no /{node_ports.RULESET} in its user-data")
    unit = written.get(node_ports.UNIT)
    if unit is None or f"-f /{node_ports.RULESET}" not in unit:
        problems.append(f"no {node_ports.UNIT_NAME} loads it")
    if node_ports.UNIT_NAME not in started:
        problems.append(f"cloud-init does not start {node_ports.UNIT_NAME}")
    needs = {f"Requires={node_ports.UNIT_NAME}", f"After={node_ports.UNIT_NAME}"}
    for path in (KUBELET_UNIT, *sockets):
        if not needs <= set(written.get(path, "").splitlines()):
            problems.append(f"{path.rpartition('/')[2]} neither requires nor waits for {node_ports.UNIT_NAME}")
    return problems


def _firewall_findings(inputs: Inputs, found: list[Found]) -> list[Finding]:
    plan, findings = inputs.plan, []
    for host in inputs.hosts():
        pool = _pool_of(plan, host)
        exposed = [f for f in _exposed(found, set(pool_hosts(plan, pool))) if f.host == host] if pool else []
        if pool is None or not exposed:
            continue
        written, started = _user_data_files(inputs.host_files(host))
        sockets = [f.where.rpartition(":")[0] for f in exposed if ".socket:" in f.where]
        problems = _loading_problems(written, started, sockets)
        chains = nft.chains(written.get(node_ports.RULESET, ""))
        for f in exposed:
            problems += _input_problems(plan, pool, chains, f)
        problems += _prometheus_problems(plan, pool, chains)
        if problems:
            findings.append(Finding(
                NAME, "break", host,
                f"the node firewall does not keep this role's unauthenticated ports to their scraper: "
                f"{'; '.join(dict.fromkeys(problems))}",
                "render the node firewall into the role's user-data (kilonode.render.node_ports: its ruleset, its "
                "unit before the kubelet and the sockets, which require it)"))
    return findings


def _chain(chains: list[nft.Chain], hook: str) -> nft.Chain | None:
    return next((c for c in chains if c.hook == hook), None)


def _sources(plan: ClusterPlan, pool: NodePoolPlan) -> Iterator[tuple[str, nft.Packet, IPv4Network, str]]:
    """(who, how the packet arrives, source, what must happen) for a port of this pool's nodes."""
    scraper = scraper_subnet(plan)
    here = scraper is not None and IPv4Network(pool.subnet) == scraper

    def packet(interface: str) -> nft.Packet:
        return nft.Packet(iif=interface, dport=0)

    yield "the node itself", packet(LOOPBACK_IF), IPv4Network("127.0.0.1/32"), "accept"
    if here:
        yield "a pod on the node", packet(POD_IF), IPv4Network(pool.subnet), "accept"
    else:
        # any source: a pod may forge one (NET_RAW is in the runtime's default capabilities), and
        # the host sees it before the virtual network would refuse it
        yield "a pod on the node, from any address", packet(POD_IF), IPv4Network("0.0.0.0/0"), "drop"
    for other in plan.node_pools:
        subnet = IPv4Network(other.subnet)
        if subnet != scraper and other.name != pool.name:
            yield f"pods of pool {other.name}", packet(NIC_IF), subnet, "drop"
    if scraper is not None:
        yield "the cluster's Prometheus", packet(NIC_IF), scraper, "accept"


def _input_problems(plan: ClusterPlan, pool: NodePoolPlan, chains: list[nft.Chain], f: Found) -> list[str]:
    chain = _chain(chains, "input")
    if chain is None:
        return [f"no input chain guards TCP {f.port}"]
    problems = []
    for who, packet, source, expected in _sources(plan, pool):
        packet = nft.Packet(iif=packet.iif, dport=f.port)
        for part, verdict, rule in nft.verdicts(chain, packet, source):
            if verdict != expected:
                problems.append(f"{who} ({part}) on TCP {f.port} ({f.row.id if f.row else '?'}): {verdict} "
                                f"({rule}), not {expected}")
                break
    return problems


def _prometheus_problems(plan: ClusterPlan, pool: NodePoolPlan, chains: list[nft.Chain]) -> list[str]:
    """Prometheus's own port, on a reserved Prometheus pool's nodes."""
    scraper = prometheus_pool(plan)
    if scraper is None or scraper.name != pool.name or users_run_on(plan, pool):
        return []
    port = next(r.port for r in listeners() if r.id == "prometheus")
    chain = _chain(chains, "forward")
    if chain is None:
        return [f"no forward chain guards Prometheus's port {port}"]
    cases = [(f"pods of pool {p.name}", IPv4Network(p.subnet), "drop") for p in plan.node_pools if p.name != pool.name]
    cases.append(("the apiservers' service proxy", IPv4Network(plan.network.control_plane_subnet), "accept"))
    problems = []
    for who, source, expected in cases:
        packet = nft.Packet(iif=NIC_IF, oif=POD_IF, dport=port)
        wrong = [(part, verdict, rule) for part, verdict, rule in nft.verdicts(chain, packet, source)
                 if verdict != expected]
        problems += [f"{who} ({part}) to Prometheus on TCP {port}: {verdict} ({rule}), not {expected}"
                     for part, verdict, rule in wrong[:1]]
    return problems


# --- the reserved pools --------------------------------------------------------------------------

def _reserved_findings(inputs: Inputs) -> list[Finding]:
    plan, findings = inputs.plan, []
    scraper = prometheus_pool(plan)
    if scraper is not None and users_run_on(plan, scraper):
        findings.append(Finding(
            NAME, "warn", f"pool-{scraper.name}",
            f"the cluster's Prometheus runs on pool {scraper.name}, where users' pods run too: the NSGs and node "
            f"firewalls admit that pool's subnet ({scraper.subnet}) as the scraper, so every pod there reads etcd's "
            "metrics, the certificate expiry, the GPU health metrics and every node's per-pod traffic port, and "
            "queries Prometheus",
            "give Prometheus a pool of its own (`monitoring: true`, with a NoSchedule taint): the reserved-pools "
            "policy then keeps users' pods off it (kilonode.plan.listeners)"))
    reserved = reserved_pools(plan)
    if not reserved:
        return findings
    if not _policy_bound(inputs):
        findings.append(Finding(
            NAME, "break", f"ValidatingAdmissionPolicy {POLICY_NAME}",
            f"pools {', '.join(p.name for p in reserved)} are reserved by taints alone, which any pod may tolerate: "
            "a user's pod there has the scraper's address and the system pods' node",
            "create the reserved-pools policy and its Deny binding (kilonode.k8s.reserved_pools)"))
    return findings + _refused_workloads(inputs, reserved)


def _policy_bound(inputs: Inputs) -> bool:
    named = [r for r in inputs.of_type(POLICY) if (r.inputs.get("metadata") or {}).get("name") == POLICY_NAME]
    bound = [r for r in inputs.of_type(BINDING) if (r.inputs.get("spec") or {}).get("policyName") == POLICY_NAME
             and "Deny" in ((r.inputs.get("spec") or {}).get("validationActions") or [])]
    return bool(named) and bool(bound)


def _taint(text: str) -> Taint:
    key_value, _, effect = text.rpartition(":")
    key, _, value = key_value.partition("=")
    return Taint(key=key, value=value, effect=effect)


def _refused_workloads(inputs: Inputs, reserved: tuple[NodePoolPlan, ...]) -> list[Finding]:
    findings = []
    for workload in inputs.workloads():
        namespace = (workload.inputs.get("metadata") or {}).get("namespace") or "default"
        spec = ((workload.inputs.get("spec") or {}).get("template") or {}).get("spec") or {}
        tolerations = pod_tolerations(workload.kind, spec)
        fits = [p.name for p in reserved if all(any(tolerates(t, _taint(k)) for t in tolerations)
                                                for k in keeping_taints(p))]
        if fits and namespace not in defaults.SYSTEM_NAMESPACES:
            findings.append(Finding(
                NAME, "break", workload.describe(),
                f"it tolerates every taint of reserved pools {', '.join(fits)} from namespace {namespace}: the "
                f"reserved-pools policy refuses its pods, none starts",
                f"run it in {' or '.join(defaults.SYSTEM_NAMESPACES)}, or tolerate only the taints it means"))
    return findings
