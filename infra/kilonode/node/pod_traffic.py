#!/usr/bin/python3
"""Bytes and packets each pod on this node sends and receives, by namespace and pod, as
Prometheus metrics: the 7,500-node post's per-namespace/pod network accounting ("iptables
tagging on the host"), with nftables and without a call to the API server from any node.

Where the counting happens: the pools run Azure CNI in transparent mode (kilonode.render.cni),
so every packet a pod sends or receives off its own host-side interface is forwarded by the
host. The table kilonode_pod_traffic (rendered by kilonode.render.pod_traffic, loaded at boot by
kilonode-pod-traffic-table.service) has, per address family, a set of pod addresses seen as
sources ("out") and one seen as destinations ("in"), each element with its own counter; the
forward chain only looks each packet up in them, which counts it (a set declared `counter`
gives every element a counter that a matching lookup updates) and decides nothing.

Who owns an address comes from the node's own state: azure-vnet's state file,
/var/run/azure-vnet.json (azure-container-networking v1.6.21, platform/os_linux.go l.28
CNIStateFilePath), which azure-vnet replaces whole (store/json.go flush: a temporary file
renamed over it) on every pod added or deleted. Its shape (network/manager.go storeKey
"Network", networkManager.ExternalInterfaces; network/network.go externalInterface.Networks,
network.Endpoints; network/endpoint.go endpoint.IPAddresses []net.IPNet, PODName,
PODNameSpace; an example in cni/client/testresources/azure-vnet-test.json):

    {"Network": {"ExternalInterfaces": {"eth0": {"Networks": {"azure": {"Endpoints": {
        "3f813b02-eth0": {"IPAddresses": [{"IP": "10.241.0.17", "Mask": "//8AAA=="}],
                          "PODName": "metrics-server-...", "PODNameSpace": "kube-system", ...}}}}}}}}

Commands:
    sync     make the sets hold exactly the addresses of the pods in the state file: a new pod's
             addresses are added; a gone pod's removed with their counters (bounded: the sets
             never hold more than the node's pods); an address that changed owner is removed
             and added again, so one pod's bytes never count for the next. Run when the state
             file changes (kilonode-pod-traffic.path) and before every answer.
    serve    answer one HTTP request on stdin/stdout (socket activation, Accept=yes): sync, then
             the metrics.
    print    sync, then the metrics on stdout.

Every address that reaches nft is parsed by `ipaddress` first; names never reach nft, and in
the metrics they are escaped as the exposition format requires (backslash, double quote, line
feed), other control characters replaced. Standard library and /usr/sbin/nft only.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

CONFIG = "/etc/kilonode/pod-traffic.json"
NFT = "/usr/sbin/nft"
FAMILY = "inet"
# (set, address family, direction): the rendered table declares exactly these
SETS = (("pods_out_v4", 4, "out"), ("pods_in_v4", 4, "in"), ("pods_out_v6", 6, "out"), ("pods_in_v6", 6, "in"))
DIRECTIONS = ("in", "out")
NFT_TIMEOUT_S = 10  # one nft call lists or changes a few hundred elements: milliseconds
MAX_REQUEST = 8192  # a scrape's request line and one header; anything longer is not Prometheus
MAX_HEADERS = 100
METRICS = (
    ("kilonode_pod_network_bytes_total", "counter",
     "Bytes the node forwarded from (out) or to (in) the pod's addresses since the pod was accounted."),
    ("kilonode_pod_network_packets_total", "counter",
     "Packets the node forwarded from (out) or to (in) the pod's addresses since the pod was accounted."),
)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Owner = tuple[str, str]  # (namespace, pod)


class StateError(ValueError):
    """The CNI state file exists but is not what azure-vnet writes."""


@dataclass
class Endpoints:
    """What the state file says: each pod address's owner, and what could not be used."""

    owners: dict[Address, Owner] = field(default_factory=dict)
    skipped: int = 0  # endpoints without a pod name, namespace or usable address; addresses owned twice


def _children(node: object, key: str) -> Iterator[tuple[str, object]]:
    """The entries of node[key], a JSON object (absent or null: none), in a stable order."""
    if not isinstance(node, dict):
        raise StateError(f"expected an object holding {key!r}")
    value = node.get(key)
    if value is None:
        return iter(())
    if not isinstance(value, dict):
        raise StateError(f"{key!r} is not an object")
    return iter(sorted(value.items()))


def _address(text: object) -> Address | None:
    if not isinstance(text, str):
        return None
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped  # Go's net.IP may hold an IPv4 address in 16 bytes
    return address


def parse_state(document: object, limit: int) -> Endpoints:
    """Each pod address's owner, from azure-vnet's state (the module docstring has its shape).
    At most `limit` addresses; endpoints beyond it are counted as skipped."""
    found = Endpoints()
    network = document.get("Network") if isinstance(document, dict) else None
    if network is None:
        return found  # azure-vnet has written no network yet: no pods
    for _name, interface in _children(network, "ExternalInterfaces"):
        for _net, net in _children(interface, "Networks"):
            for _id, endpoint in _children(net, "Endpoints"):
                _endpoint(endpoint, found, limit)
    return found


def _endpoint(endpoint: object, found: Endpoints, limit: int) -> None:
    if not isinstance(endpoint, dict):
        raise StateError("an endpoint is not an object")
    namespace, pod = endpoint.get("PODNameSpace"), endpoint.get("PODName")
    entries = endpoint.get("IPAddresses") or []
    addresses = [_address(e.get("IP")) for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
    usable = [a for a in addresses if a is not None]
    if not (isinstance(namespace, str) and namespace and isinstance(pod, str) and pod and usable):
        found.skipped += 1
        return
    for address in usable:
        if address in found.owners or len(found.owners) >= limit:
            found.skipped += 1
            continue
        found.owners[address] = (namespace, pod)


def read_state(path: str, limit: int) -> Endpoints:
    """The state file's endpoints; no file yet (no pod has had a network): none."""
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except FileNotFoundError:
        return Endpoints()
    except (OSError, ValueError) as error:
        raise StateError(f"{path}: {error}") from error
    return parse_state(document, limit)


# --- nftables ----------------------------------------------------------------------------------
def _nft(args: list[str], script: str | None = None) -> str:
    result = subprocess.run([NFT, *args], input=script, capture_output=True, text=True,
                            timeout=NFT_TIMEOUT_S, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"nft {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def counters(table: str) -> dict[str, dict[Address, tuple[int, int]]]:
    """set name -> address -> (packets, bytes), as the kernel holds them now (nft's JSON)."""
    listing = json.loads(_nft(["-j", "list", "table", FAMILY, table]))
    found: dict[str, dict[Address, tuple[int, int]]] = {name: {} for name, _, _ in SETS}
    for item in listing.get("nftables", []):
        nft_set = item.get("set") if isinstance(item, dict) else None
        if not nft_set or nft_set.get("name") not in found:
            continue
        for element in nft_set.get("elem", []):
            inner = element.get("elem", {}) if isinstance(element, dict) else {}
            address = _address(inner.get("val"))
            counter = inner.get("counter") or {}
            if address is not None:
                found[nft_set["name"]][address] = (int(counter.get("packets", 0)), int(counter.get("bytes", 0)))
    return found


def changes(table: str, live: dict[str, dict[Address, tuple[int, int]]], previous: dict[Address, Owner],
            wanted: dict[Address, Owner]) -> str:
    """One nft transaction that makes the sets hold `wanted`: elements of addresses gone or owned
    by another pod than `previous` says are deleted (an element with no known owner too), and
    the wanted ones not there (or just deleted) are added with fresh counters."""
    lines = []
    for name, version, _direction in SETS:
        present = set(live[name])
        stale = sorted((a for a in present if a not in wanted or previous.get(a) != wanted[a]), key=str)
        fresh = sorted((a for a in wanted if a.version == version and (a not in present or a in stale)), key=str)
        if stale:
            lines.append(f"delete element {FAMILY} {table} {name} {{ {', '.join(map(str, stale))} }}")
        if fresh:
            lines.append(f"add element {FAMILY} {table} {name} {{ {', '.join(map(str, fresh))} }}")
    return "".join(f"{line}\n" for line in lines)


# --- sync ---------------------------------------------------------------------------------------
@dataclass
class Snapshot:
    owners: dict[Address, Owner]
    live: dict[str, dict[Address, tuple[int, int]]]
    state_readable: bool
    skipped: int


def _load_owners(path: str) -> dict[Address, Owner]:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        return {a: (ns, pod) for text, (ns, pod) in data.items() if (a := _address(text)) is not None}
    except (OSError, ValueError, TypeError):
        return {}  # no record (first run, or /run cleared): every element's owner is unknown


def _save_owners(path: str, owners: dict[Address, Owner]) -> None:
    directory = os.path.dirname(path)
    with tempfile.NamedTemporaryFile("w", dir=directory, delete=False, encoding="utf-8") as handle:
        json.dump({str(a): list(owner) for a, owner in sorted(owners.items(), key=lambda i: str(i[0]))}, handle)
    os.replace(handle.name, path)


def sync(config: dict[str, Any]) -> Snapshot:
    """Bring the sets in line with the state file; return what the metrics need. Serialised by a
    lock: the path unit's run and a scrape's may overlap."""
    table, run_dir = str(config["table"]), str(config["runDir"])
    os.makedirs(run_dir, mode=0o755, exist_ok=True)
    owners_path = os.path.join(run_dir, "owners.json")
    with open(os.path.join(run_dir, "lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        previous = _load_owners(owners_path)
        live = counters(table)
        try:
            endpoints = read_state(str(config["stateFile"]), int(config["maxAddresses"]))
        except StateError as error:
            # keep what is counted: a state file that cannot be read says nothing about which
            # pods are gone; the metric kilonode_pod_network_state_readable says it
            print(f"pod-traffic: {error}", file=sys.stderr)
            known = set().union(*(set(s) for s in live.values()))
            return Snapshot({a: o for a, o in previous.items() if a in known}, live, False, 0)
        script = changes(table, live, previous, endpoints.owners)
        if script:
            _nft(["-f", "-"], script)
            live = counters(table)
        _save_owners(owners_path, endpoints.owners)
        return Snapshot(endpoints.owners, live, True, endpoints.skipped)


# --- metrics ------------------------------------------------------------------------------------
def label(value: str) -> str:
    """A label value as the text exposition format needs it: valid UTF-8, with backslash, double
    quote and line feed escaped; other control characters (no Kubernetes name has one) replaced,
    so no value can end a line or a label early."""
    text = value.encode("utf-8", "replace").decode("utf-8")
    text = "".join(c if c == "\n" or c.isprintable() else "\ufffd" for c in text)
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics(snapshot: Snapshot) -> str:
    """The exposition: per pod and direction, the sums over the pod's addresses."""
    totals: dict[tuple[str, str, str], list[int]] = {}
    for name, _version, direction in SETS:
        for address, (packets, octets) in snapshot.live[name].items():
            owner = snapshot.owners.get(address)
            if owner is None:
                continue  # added by no sync of ours: not a pod we can name
            total = totals.setdefault((*owner, direction), [0, 0])
            total[0] += packets
            total[1] += octets
    lines = []
    for (metric, kind, text), index in zip(METRICS, (1, 0), strict=True):
        lines += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}"]
        lines += [f'{metric}{{namespace="{label(ns)}",pod="{label(pod)}",direction="{direction}"}} {value[index]}'
                  for (ns, pod, direction), value in sorted(totals.items())]
    lines += [
        "# HELP kilonode_pod_network_state_readable Whether the CNI state file could be read (1) or not (0).",
        "# TYPE kilonode_pod_network_state_readable gauge",
        f"kilonode_pod_network_state_readable {int(snapshot.state_readable)}",
        "# HELP kilonode_pod_network_endpoints_skipped CNI endpoints or addresses left unaccounted "
        "(no pod name, no address, an address owned twice, or past the limit).",
        "# TYPE kilonode_pod_network_endpoints_skipped gauge",
        f"kilonode_pod_network_endpoints_skipped {snapshot.skipped}",
        "# HELP kilonode_pod_network_addresses Pod addresses being counted on this node.",
        "# TYPE kilonode_pod_network_addresses gauge",
        f"kilonode_pod_network_addresses {len(snapshot.owners)}",
    ]
    return "\n".join(lines) + "\n"


def serve(stdin: BinaryIO, stdout: BinaryIO, config: dict[str, Any]) -> None:
    """Answer one HTTP request (socket activation: the connection is stdin and stdout)."""
    method = stdin.readline(MAX_REQUEST).split(b" ", 1)[0]
    for _header in range(MAX_HEADERS):  # the headers, bounded: nothing in them changes the answer
        if stdin.readline(MAX_REQUEST) in (b"", b"\r\n", b"\n"):
            break
    if method not in (b"GET", b"HEAD"):
        stdout.write(b"HTTP/1.0 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
        return
    try:
        body, status = metrics(sync(config)).encode(), b"200 OK"
    except (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError) as error:
        # the table is missing or nft failed: a failed scrape (up stays 1, the series go stale)
        print(f"pod-traffic: {error}", file=sys.stderr)
        body, status = f"{type(error).__name__}: {error}\n".encode(), b"500 Internal Server Error"
    stdout.write(b"HTTP/1.0 " + status + b"\r\nContent-Type: text/plain; version=0.0.4\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + (body if method == b"GET" else b""))
    stdout.flush()


def main(argv: list[str]) -> int:
    path = argv[argv.index("--config") + 1] if "--config" in argv else CONFIG
    with open(path, encoding="utf-8") as handle:
        config = json.load(handle)
    command = argv[0] if argv else ""
    if command == "sync":
        snapshot = sync(config)
        print(f"pod-traffic: {len(snapshot.owners)} pod addresses counted, {snapshot.skipped} skipped")
        return 0 if snapshot.state_readable else 1
    if command == "print":
        sys.stdout.write(metrics(sync(config)))
        return 0
    if command == "serve":
        serve(sys.stdin.buffer, sys.stdout.buffer, config)
        return 0
    print("usage: pod-traffic sync|print|serve [--config FILE]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
