"""Hygiene on the running node: keys-only SSH, no passwords, no build-host mirror."""

from __future__ import annotations

import contextlib
import re
from typing import Any

import paramiko
import pytest
import testinfra

from kilonode.image import mirror
from kilonode.image.probes import run_ok


@pytest.mark.persistent
def test_sshd_refuses_passwords(ssh: dict[str, Any]) -> None:
    """Ask sshd itself which methods it offers to a client that has not authenticated yet."""
    with contextlib.closing(paramiko.Transport((ssh["address"], int(ssh["port"])))) as transport:
        transport.start_client(timeout=30)
        try:
            transport.auth_none(ssh["user"])
            pytest.fail("sshd accepted a login with no credentials at all")
        except paramiko.BadAuthenticationType as err:
            allowed = list(err.allowed_types)
    assert "password" not in allowed and "keyboard-interactive" not in allowed, f"sshd offers {allowed}"


def test_sshd_effective_config(host: testinfra.host.Host) -> None:
    effective = dict(
        line.split(" ", 1) for line in run_ok(host, "sshd -T").splitlines() if " " in line
    )
    assert effective["passwordauthentication"] == "no"
    assert effective["kbdinteractiveauthentication"] == "no"
    assert effective["permitemptypasswords"] == "no"
    assert effective["permitrootlogin"] == "no"


@pytest.mark.persistent
def test_no_account_has_a_usable_password(host: testinfra.host.Host) -> None:
    usable = [
        line.split(":")[0]
        for line in run_ok(host, "cat /etc/shadow").splitlines()
        if ":" in line and not re.match(r"^[!*]", line.split(":")[1] or "")
    ]
    assert usable == [], f"accounts with a password (or an empty one): {usable}"


def test_machine_id_made_on_this_node(host: testinfra.host.Host) -> None:
    machine_id = run_ok(host, "cat /etc/machine-id").strip()
    assert re.fullmatch(r"[0-9a-f]{32}", machine_id), f"machine-id {machine_id!r}"


def test_host_keys_made_on_this_node(host: testinfra.host.Host) -> None:
    keys = run_ok(host, "ls /etc/ssh").split()
    assert "ssh_host_ed25519_key" in keys, f"no ed25519 host key: {keys}"


def test_no_apt_sources_or_mirror_names(host: testinfra.host.Host) -> None:
    listed = run_ok(host, "ls -A /etc/apt/sources.list.d").split()
    assert not [n for n in listed if n.endswith((".list", ".sources"))], f"apt sources in the image: {listed}"
    assert not host.file("/etc/apt/sources.list").exists
    # The build machine's mirror names are read where the suite runs and searched here, in
    # Python: they must never appear in a command line, a log or a failure message.
    hosts = [h.encode() for h in mirror.mirror_hosts()]
    paths = "/etc/apt /var/lib/apt /etc/hosts /etc/resolv.conf"
    everything = host.run(f"find {paths} -type f -size -1M -exec cat {{}} +").stdout.encode().lower()
    if any(h in everything for h in hosts):  # only then look for which file, one by one
        files = host.run(f"find {paths} -type f -size -1M").stdout.split()
        named = [f for f in files if any(h in host.run(f"cat {f}").stdout.encode().lower() for h in hosts)]
        pytest.fail(f"the build host's mirror is named in: {named}")
