"""The per-pod traffic program's pure parts (kilonode/node/pod_traffic.py): azure-vnet's state
file read as azure-container-networking v1.6.21 writes it, the nft changes a sync makes, and the
exposition, with hostile pod names that must not break the format, read back label by label
(Prometheus' own parser reads the same exposition in tests/monitoring/test_pod_traffic.py)."""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path
from typing import Any

import pytest

from kilonode.node import pod_traffic
from kilonode.node.pod_traffic import Snapshot, StateError, changes, label, metrics, parse_state

# azure-container-networking v1.6.21 cni/client/testresources/azure-vnet-test.json: one endpoint
# as azure-vnet writes it (fields the program does not read included, PODName/PODNameSpace as
# endpoint.go's JSON names them, the mask as Go's net.IPMask base64)
UPSTREAM_ENDPOINT = {
    "Id": "3f813b02-eth0", "SandboxKey": "", "IfName": "azvd805fb1b0f82", "HostIfName": "azvd805fb1b0f8",
    "MacAddress": "ipNAs8jK", "InfraVnetIP": {"IP": "", "Mask": None}, "LocalIP": "",
    "IPAddresses": [{"IP": "10.241.0.17", "Mask": "//8AAA=="}], "Gateways": ["0.0.0.0"],
    "DNS": {"Suffix": "", "Servers": None, "Options": None}, "VlanID": 0, "EnableSnatOnHost": False,
    "NetworkNameSpace": "/var/run/netns/cni-e66c52d6-44be-555b-fb65-0b36296b6861",
    "ContainerID": "3f813b029429b4e41a09ab33b6f6d365d2ed704017524c78d1d0dece33cdaf46",
    "PODName": "metrics-server-77c8679d7d-6ksdh", "PODNameSpace": "kube-system",
}
HOSTILE = ['a"b', "line\nbreak", "back\\slash", 'all"\\\n"', "tab\there", "bell\x07", "\u2028sep", "ünïcode",
           "x" * 300, "lone\ud800surrogate", '"} 1\nkilonode_pod_network_bytes_total{namespace="evil"']


def state(endpoints: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"Network": {"Version": "v1.6.21", "TimeStamp": "2021-06-04T17:15:58.638215441Z", "ExternalInterfaces": {
        "eth0": {"Name": "eth0", "Networks": {"azure": {"Id": "azure", "Mode": "transparent",
                                                         "Endpoints": endpoints}}}}}}


def endpoint(ip: str | list[str], namespace: str, pod: str) -> dict[str, Any]:
    ips = [ip] if isinstance(ip, str) else ip
    return {**UPSTREAM_ENDPOINT, "IPAddresses": [{"IP": i, "Mask": "//8AAA=="} for i in ips],
            "PODName": pod, "PODNameSpace": namespace}


def test_the_upstream_example_names_its_pod() -> None:
    found = parse_state(state({"3f813b02-eth0": UPSTREAM_ENDPOINT}), 1024)
    assert found.owners == {ipaddress.ip_address("10.241.0.17"): ("kube-system", "metrics-server-77c8679d7d-6ksdh")}
    assert found.skipped == 0


def test_unusable_endpoints_are_skipped_and_counted_never_guessed() -> None:
    found = parse_state(state({
        "a": endpoint("10.0.0.1", "ns", "good"),
        "b": endpoint("10.0.0.2", "", "no-namespace"),
        "c": {**endpoint("10.0.0.3", "ns", "x"), "PODName": None},
        "d": endpoint("not-an-ip", "ns", "bad-ip"),
        "e": endpoint("10.0.0.1", "ns", "duplicate"),  # sorted after "a": the address is a's
        "f": endpoint(["10.0.0.6", "fd00::6", "::ffff:10.0.0.7"], "ns", "dual"),
    }), 1024)
    owners = {str(a): o for a, o in found.owners.items()}
    assert owners == {"10.0.0.1": ("ns", "good"), "10.0.0.6": ("ns", "dual"), "fd00::6": ("ns", "dual"),
                      "10.0.0.7": ("ns", "dual")}  # Go's 16-byte IPv4 form read as IPv4
    assert found.skipped == 4


def test_the_address_limit_bounds_what_is_counted() -> None:
    found = parse_state(state({f"e{i:03}": endpoint(f"10.0.1.{i}", "ns", f"p{i}") for i in range(20)}), 8)
    assert len(found.owners) == 8 and found.skipped == 12


@pytest.mark.parametrize("document", [{"Network": {"ExternalInterfaces": []}},
                                      state({"a": "not an object"}),  # type: ignore[dict-item]
                                      {"Network": "x"}])
def test_a_state_file_of_another_shape_is_an_error(document: Any) -> None:
    with pytest.raises(StateError):
        parse_state(document, 1024)


def test_no_network_yet_means_no_pods(tmp_path: Path) -> None:
    assert parse_state({}, 1024).owners == {}
    assert pod_traffic.read_state(str(tmp_path / "absent.json"), 1024).owners == {}
    (tmp_path / "torn.json").write_text('{"Network": ')
    with pytest.raises(StateError):
        pod_traffic.read_state(str(tmp_path / "torn.json"), 1024)


def A(text: str) -> pod_traffic.Address:  # an address literal, short for the tables below
    return ipaddress.ip_address(text)


def test_a_sync_adds_new_pods_removes_gone_ones_and_resets_an_address_that_changed_owner() -> None:
    live: dict[str, dict[pod_traffic.Address, tuple[int, int]]] = {name: {} for name, _, _ in pod_traffic.SETS}
    for name in ("pods_out_v4", "pods_in_v4"):
        live[name] = {A("10.0.0.1"): (5, 500), A("10.0.0.2"): (1, 100), A("10.0.0.9"): (1, 1)}
    previous = {A("10.0.0.1"): ("ns", "stays"), A("10.0.0.2"): ("ns", "old-owner")}  # .9: owner unknown
    wanted = {A("10.0.0.1"): ("ns", "stays"), A("10.0.0.2"): ("ns", "new-owner"), A("10.0.0.3"): ("ns", "new"),
              A("fd00::3"): ("ns", "new")}
    script = changes("kilonode_pod_traffic", live, previous, wanted).splitlines()
    assert script == [
        "delete element inet kilonode_pod_traffic pods_out_v4 { 10.0.0.2, 10.0.0.9 }",
        "add element inet kilonode_pod_traffic pods_out_v4 { 10.0.0.2, 10.0.0.3 }",
        "delete element inet kilonode_pod_traffic pods_in_v4 { 10.0.0.2, 10.0.0.9 }",
        "add element inet kilonode_pod_traffic pods_in_v4 { 10.0.0.2, 10.0.0.3 }",
        "add element inet kilonode_pod_traffic pods_out_v6 { fd00::3 }",
        "add element inet kilonode_pod_traffic pods_in_v6 { fd00::3 }",
    ]
    # in line already: nothing to do
    done = {name: {a: (0, 0) for a in wanted if a.version == v} for name, v, _ in pod_traffic.SETS}
    assert changes("kilonode_pod_traffic", done, wanted, wanted) == ""


LINE = re.compile(r'^(\w+)\{namespace="((?:[^"\\]|\\.)*)",pod="((?:[^"\\]|\\.)*)",direction="(in|out)"\} (\d+)$')


def unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def hostile_snapshot() -> Snapshot:
    owners = {A(f"10.0.2.{i}"): (f"ns-{name}", name) for i, name in enumerate(HOSTILE)}
    live = {name: {} for name, _, _ in pod_traffic.SETS}
    live["pods_out_v4"] = {a: (i + 1, 1000 * (i + 1)) for i, a in enumerate(owners)}
    live["pods_in_v4"] = {a: (2, 20) for a in owners}
    return Snapshot(owners, live, True, 0)


def test_hostile_names_stay_inside_their_label_values() -> None:
    text = metrics(hostile_snapshot())
    samples = [LINE.match(line) for line in text.splitlines() if line.startswith("kilonode_pod_network_")
               and "{" in line]
    assert all(samples), [line for line in text.splitlines() if not line.startswith("#")]
    assert len(samples) == len(HOSTILE) * 4  # bytes and packets, in and out: nothing more, nothing less
    read = {(m.group(1), unescape(m.group(3)), m.group(4)): int(m.group(5)) for m in samples if m}
    for i, name in enumerate(HOSTILE):
        shown = name.encode("utf-8", "replace").decode()
        shown = "".join(c if c == "\n" or c.isprintable() else "\ufffd" for c in shown)
        assert read[("kilonode_pod_network_bytes_total", shown, "out")] == 1000 * (i + 1)
        assert read[("kilonode_pod_network_packets_total", shown, "in")] == 2
    assert label("tab\there") == "tab\ufffdhere" and label('a"b\\c\nd') == 'a\\"b\\\\c\\nd'


def test_the_program_prints_what_a_sync_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`sync` against a stand-in for nft: what it lists, and the transaction it is given."""
    (tmp_path / "state.json").write_text(json.dumps(state({"a": endpoint("10.0.0.1", "team-a", "p")})))
    calls: list[tuple[list[str], str | None]] = []
    elements: list[dict[str, Any]] = []

    def nft(args: list[str], script: str | None = None) -> str:
        calls.append((args, script))
        if script and "add element" in script:
            elements.append({"elem": {"val": "10.0.0.1", "counter": {"packets": 3, "bytes": 300}}})
        sets = [{"set": {"name": name, "elem": elements}} for name, _, _ in pod_traffic.SETS if name.endswith("v4")]
        return json.dumps({"nftables": [{"metainfo": {}}, *sets]})

    monkeypatch.setattr(pod_traffic, "_nft", nft)
    config = {"stateFile": str(tmp_path / "state.json"), "table": "t", "runDir": str(tmp_path / "run"),
              "maxAddresses": 16}
    text = metrics(pod_traffic.sync(config))
    assert 'kilonode_pod_network_bytes_total{namespace="team-a",pod="p",direction="out"} 300' in text
    assert [c[0] for c in calls] == [["-j", "list", "table", "inet", "t"], ["-f", "-"],
                                     ["-j", "list", "table", "inet", "t"]]
    assert json.loads((tmp_path / "run" / "owners.json").read_text()) == {"10.0.0.1": ["team-a", "p"]}
    # a torn state file keeps what is counted and says so
    (tmp_path / "state.json").write_text("{")
    snapshot = pod_traffic.sync(config)
    assert not snapshot.state_readable and snapshot.owners == {A("10.0.0.1"): ("team-a", "p")}
    assert "kilonode_pod_network_state_readable 0" in metrics(snapshot)
