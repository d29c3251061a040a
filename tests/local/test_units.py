"""Reading the rendered units back and mapping them onto this machine (kilonode.local.units,
.addresses), and the process bookkeeping (kilonode.local.etcd) with stand-in processes."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from ipaddress import IPv4Address
from pathlib import Path

import pytest

from kilonode.local import etcd, units
from kilonode.local.addresses import AddressError, address_map, loopback
from kilonode.plan import ClusterPlan, pki, wellknown
from kilonode.render.etcd import ETCD_UNIT
from tests import shared

UNIT = """[Service]
Environment=ETCD_INITIAL_CLUSTER_STATE=new "OTHER=a b"
EnvironmentFile=-/run/etcd/join.env
ExecStartPre=/usr/local/lib/kilonode/etcd-join
ExecStart=/usr/local/bin/etcd \\
    --name=etcd-main-0 \\
    --data-dir=/mnt/local-ssd/etcd \\
    --listen-client-urls=https://10.0.1.10:2379,https://127.0.0.1:2379 \\
    --initial-cluster=etcd-main-0=https://10.0.1.10:2380,etcd-main-1=https://10.0.1.11:2380 \\
    --log-outputs=100%%-sure \\
    --trusted-ca-file=/etc/etcd/pki/client-ca.crt
Restart=always
"""
ADDRESSES = {"10.0.1.10": "127.0.1.10", "10.0.1.11": "127.0.1.11"}
FILES = {"/mnt/local-ssd/etcd": "/state/etcd-main-0/data", "/etc/etcd/pki/client-ca.crt": "/state/ca.crt"}


def test_exec_start_joins_continuations_and_unescapes_what_systemd_would() -> None:
    argv = units.exec_start(UNIT)
    assert argv[0] == "/usr/local/bin/etcd" and len(argv) == 7
    assert "--log-outputs=100%-sure" in argv  # systemd reads %% as %


def test_localise_maps_addresses_and_host_paths_and_drops_the_shared_localhost_listener() -> None:
    args = units.localise(units.unit_flags(UNIT), ADDRESSES, FILES)
    assert args == [
        "--name=etcd-main-0",
        "--data-dir=/state/etcd-main-0/data",
        "--listen-client-urls=https://127.0.1.10:2379",
        "--initial-cluster=etcd-main-0=https://127.0.1.10:2380,etcd-main-1=https://127.0.1.11:2380",
        "--log-outputs=100%-sure",
        "--trusted-ca-file=/state/ca.crt",
    ]


def test_an_address_is_mapped_whole_never_as_a_prefix_of_another() -> None:
    assert units.local_addresses("https://10.0.1.100:2379,https://10.0.1.1:2379", {"10.0.1.1": "127.0.1.1"}) == \
        "https://10.0.1.100:2379,https://127.0.1.1:2379"


@pytest.mark.parametrize(("flags", "message"), [
    ([("wal-dir", "/var/lib/etcd/wal")], "no local copy"),
    ([("advertise-client-urls", "https://10.0.9.9:2379")], "no loopback address"),
    ([("listen-peer-urls", "https://127.0.0.1:2380")], "127.0.0.1 only"),
])
def test_localise_refuses_what_would_touch_the_host_or_a_real_network(flags: list[tuple[str, str]],
                                                                      message: str) -> None:
    with pytest.raises(units.UnitError, match=message):
        units.localise(flags, ADDRESSES, FILES)


@pytest.mark.parametrize(("unit", "message"), [
    ("ExecStart=/bin/etcd --a=1\nExecStart=/bin/etcd --b=2\n", "2 ExecStart"),
    ("[Service]\n", "0 ExecStart"),
    ("ExecStart=/bin/etcd --name=%H\n", "specifier"),
    ("ExecStart=/bin/etcd positional\n", "not a --flag=value"),
    ("EnvironmentFile=/etc/default/etcd\nExecStart=/bin/etcd\n", "requires EnvironmentFile"),
])
def test_units_the_rehearsal_cannot_run_as_rendered_are_refused(unit: str, message: str) -> None:
    with pytest.raises(units.UnitError, match=message):
        units.unit_flags(unit)
        units.environment(unit)


def test_environment_assignments_are_read_as_systemd_does() -> None:
    assert units.environment(UNIT) == {"ETCD_INITIAL_CLUSTER_STATE": "new", "OTHER": "a b"}


def test_overrides_parse_as_the_apiserver_flag_help_says() -> None:
    value = "/pods#http://etcd4:2379;http://etcd5:2379,/events#http://etcd6:2379"
    assert units.etcd_servers_overrides(value) == {"/pods": ["http://etcd4:2379", "http://etcd5:2379"],
                                                   "/events": ["http://etcd6:2379"]}
    with pytest.raises(units.UnitError, match="group/resource#servers"):
        units.etcd_servers_overrides("https://10.0.1.20:2379")


@pytest.mark.parametrize("stack", ["local", "research-2500", "research-7500"])
def test_every_rendered_member_localises_to_loopback_and_state_files_only(plans: dict[str, ClusterPlan],
                                                                          stack: str) -> None:
    plan = plans[stack]
    rendered = shared.rendered(stack)
    addresses = address_map(plan)
    layout = pki.pki_layout(plan)
    for cluster in plan.etcd_clusters:
        for member in cluster.members:
            flags = units.unit_flags(rendered[member.name][ETCD_UNIT].content)
            files = {f.path: f"/state{f.path}" for f in layout.hosts[member.name]} | {cluster.data_dir: "/state/data"}
            args = units.localise(flags, addresses, files)
            text = " ".join(args)
            assert "10." not in text.replace("127.", "")
            assert f"--listen-peer-urls=https://{loopback(member.ip)}:2380" in args
            # every TLS file the unit names is one the PKI layout delivers to the member
            named = {v for n, v in flags if n.endswith(("-file", "cert-file", "key-file"))}
            assert named <= {f.path for f in layout.hosts[member.name]}
            assert {wellknown.ETCD_SERVER_CERT, wellknown.ETCD_PEER_KEY} <= named


def test_loopback_addresses_are_stable_and_one_to_one(plans: dict[str, ClusterPlan]) -> None:
    assert loopback(IPv4Address("10.0.1.10")) == IPv4Address("127.0.1.10")
    assert loopback(IPv4Address("192.168.4.5")) == IPv4Address("127.168.4.5")
    mapping = address_map(plans["research-7500"])
    assert len(set(mapping.values())) == len(mapping) >= 11
    with pytest.raises(AddressError, match=re.escape("127.0.0.1")):
        loopback(IPv4Address("10.0.0.1"))


def _member(tmp_path: Path, argv: list[str], listens: tuple[tuple[str, int, str], ...] = ()) -> etcd.Member:
    return etcd.Member("main", "m", "127.0.0.99", tuple(argv), tmp_path, "https://127.0.0.99:2379", listens)


def test_a_port_held_by_another_process_is_named(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.3.2.1", 0))
        held.listen()
        port = held.getsockname()[1]
        holder = etcd.listener("127.3.2.1", port)
        assert holder is not None and f"PID {os.getpid()}" in holder
        with pytest.raises(etcd.EtcdError, match=re.escape(f"127.3.2.1:{port}") + f".*taken by PID {os.getpid()}"):
            etcd.check_ports(_member(tmp_path, ["x"], (("127.3.2.1", port, "listen-client-urls"),)))
    assert etcd.listener("127.3.2.1", port) is None


def test_pid_files_are_trusted_only_for_the_recorded_command_line(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import time; time.sleep(30)", "--data-dir=x"]
    member = _member(tmp_path, argv)
    assert etcd.probe(member).state == "stopped"
    pid = etcd.start(member)
    try:
        assert etcd.probe(member) == etcd.ProcessState("running", pid, "running")
        assert os.getsid(pid) == pid  # its own session: detached from ours
        other = _member(tmp_path, [*argv, "--extra=1"])
        assert etcd.probe(other).state == "foreign"
        assert "not this member" in etcd.probe(other).detail
        # a foreign PID is left alone by stop
        assert "left alone" in etcd.stop([[other]])["m"]
        member.pid_file.write_text(f"{pid}\n")
        assert etcd.alive(pid)
    finally:
        outcome = etcd.stop([[member]], timeout_s=5)
    assert outcome == {"m": f"stopped (PID {pid})"} and not etcd.alive(pid)
    member.pid_file.write_text(f"{pid}\n")
    assert etcd.probe(member).state == "dead" and "stale PID file" in etcd.probe(member).detail


def test_a_process_that_ignores_sigterm_is_killed_after_the_bounded_wait(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)"]
    member = _member(tmp_path, argv)
    pid = etcd.start(member)
    try:
        for _ in range(100):  # until its handler is installed (bounded: 10 s)
            if "ready" in member.log_file.read_text():
                break
            subprocess.run(["sleep", "0.1"], check=True)
        outcome = etcd.stop([[member]], timeout_s=0.2)
    finally:
        if etcd.alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert outcome["m"].startswith("killed") and not etcd.alive(pid)


def test_the_state_dir_follows_xdg_state_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from kilonode.local.rehearsal import default_state_dir

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert default_state_dir("local") == tmp_path / "kilonode" / "local" / "local"
    # unset, or relative (which the XDG Base Directory specification says to ignore): ~/.local/state
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for value in ("", "relative/dir"):
        monkeypatch.setenv("XDG_STATE_HOME", value)
        assert default_state_dir("research-7500") == tmp_path / "home/.local/state/kilonode/local/research-7500"
