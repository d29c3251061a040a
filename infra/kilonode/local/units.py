"""The rendered units' command lines, read back and mapped onto this machine.

The rehearsal runs what the renderer wrote, not a second copy of the flags: `exec_start`
reads a unit's ExecStart the way systemd does for these units (continuation lines joined,
words split, `%%` and `$$` unescaped: kilonode.render.common.systemd_exec doubles them), and
`localise` changes exactly two things in each flag value:

- every Azure address of the plan becomes its loopback address (kilonode.local.addresses);
- every host path the rehearsal provides (certificates, the data dir) becomes its local copy.

A host path without a local copy, or an address left outside 127.0.0.0/8, is an error, not
a silent pass-through: a local etcd must never write under /mnt or /etc, nor listen on a
real network address.

    >>> localise([("listen-client-urls", "https://10.0.1.10:2379,https://127.0.0.1:2379")],
    ...          {"10.0.1.10": "127.0.1.10"}, {})
    ['--listen-client-urls=https://127.0.1.10:2379']
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from ipaddress import IPv4Address
from urllib.parse import urlsplit

_IP = re.compile(r"(?<![\d.])(\d{1,3}(?:\.\d{1,3}){3})(?![\d.])")
# A flag value that is a host path: absolute, one path (no list or override syntax in it).
_PATH = re.compile(r"/[^,;#=\s]*")
# systemd's ExecStart prefixes that change how a command runs, not its arguments
# (systemd.service(5), "Table 1. Special executable prefixes"); `@` changes argv[0].
_PREFIXES = "-:+!"


class UnitError(ValueError):
    """A unit or a flag the rehearsal cannot run as rendered; says which and why."""


def _settings(unit: str, key: str) -> list[str]:
    """The values of `key=` lines, continuation lines joined."""
    logical: list[str] = []
    pending = ""
    for line in unit.splitlines():
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    return [line.split("=", 1)[1].strip() for line in logical if line.startswith(f"{key}=")]


def exec_start(unit: str, name: str = "unit") -> list[str]:
    """The argv of the unit's one ExecStart= line."""
    commands = _settings(unit, "ExecStart")
    if len(commands) != 1:
        raise UnitError(f"{name} has {len(commands)} ExecStart= lines; the rehearsal runs exactly one")
    command = commands[0].lstrip(_PREFIXES)
    if command.startswith("@"):
        raise UnitError(f"{name}'s ExecStart sets its own argv[0] (@): not supported")
    words = shlex.split(command)
    if not words:
        raise UnitError(f"{name}'s ExecStart is empty")
    for word in words:
        if "%" in word.replace("%%", "") or "$" in word.replace("$$", ""):
            raise UnitError(f"{name}'s ExecStart uses a systemd specifier or variable ({word!r}): not supported")
    return [w.replace("%%", "%").replace("$$", "$") for w in words]


def environment(unit: str, name: str = "unit") -> dict[str, str]:
    """The unit's Environment= assignments, in order (a later one wins, as in systemd).

    An optional EnvironmentFile= (`-` prefix) is written at boot by the unit's own
    ExecStartPre on Azure (etcd-join's verdict); it does not exist here, as on a first
    boot. A required one would change what runs, so it is refused.
    """
    for path in _settings(unit, "EnvironmentFile"):
        if not path.startswith("-"):
            raise UnitError(f"{name} requires EnvironmentFile={path}, which the rehearsal does not provide")
    found: dict[str, str] = {}
    for value in _settings(unit, "Environment"):
        for word in shlex.split(value):
            key, sep, setting = word.partition("=")
            if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise UnitError(f"{name} has Environment={value!r}: not NAME=value assignments")
            found[key] = setting.replace("%%", "%").replace("$$", "$")
    return found


def flags_of(argv: list[str], name: str = "unit") -> list[tuple[str, str]]:
    """`--name=value` arguments after the binary, in order."""
    flags = []
    for arg in argv[1:]:
        match = re.fullmatch(r"--([a-z0-9][a-z0-9-]*)=(.*)", arg, re.S)
        if not match:
            raise UnitError(f"{name}'s ExecStart has {arg!r}, not a --flag=value")
        flags.append((match.group(1), match.group(2)))
    return flags


def unit_flags(unit: str, name: str = "unit") -> list[tuple[str, str]]:
    return flags_of(exec_start(unit, name), name)


def flag(flags: list[tuple[str, str]], name: str) -> str:
    values = [v for n, v in flags if n == name]
    if len(values) != 1:
        raise UnitError(f"--{name} is set {len(values)} times; expected once")
    return values[0]


def localise(flags: list[tuple[str, str]], addresses: Mapping[str, str], files: Mapping[str, str]) -> list[str]:
    """`--name=value` arguments with addresses and host paths mapped (module docstring)."""
    args = []
    for name, value in flags:
        value = local_addresses(value, addresses)
        if name.startswith("listen-"):
            # on a real host every member also listens on 127.0.0.1; here all members share
            # that address, so each keeps only its own
            value = ",".join(u for u in value.split(",") if urlsplit(u).hostname != "127.0.0.1")
            if not value:
                raise UnitError(f"--{name} listens on 127.0.0.1 only; it has no address of its own")
        if _PATH.fullmatch(value):
            if value not in files:
                raise UnitError(f"--{name}={value} is a host path the rehearsal has no local copy of")
            value = files[value]
        for found in _IP.findall(value):
            if not IPv4Address(found).is_loopback:
                raise UnitError(f"--{name} names {found}, which has no loopback address in this plan")
        args.append(f"--{name}={value}")
    return args


def local_addresses(value: str, addresses: Mapping[str, str]) -> str:
    return _IP.sub(lambda m: addresses.get(m.group(1), m.group(1)), value)


def etcd_servers(value: str) -> list[str]:
    """--etcd-servers: URLs, comma separated."""
    return [u for u in value.split(",") if u]


def etcd_servers_overrides(value: str) -> dict[str, list[str]]:
    """--etcd-servers-overrides: `group/resource#servers` entries, comma separated, servers
    semicolon separated (kube-apiserver's flag help, k8s.io/apiserver
    pkg/server/options/etcd.go `AddFlags`). Keyed by `group/resource` (`/events`)."""
    overrides: dict[str, list[str]] = {}
    for entry in filter(None, value.split(",")):
        resource, sep, servers = entry.partition("#")
        if not sep or "/" not in resource:
            raise UnitError(f"--etcd-servers-overrides entry {entry!r} is not group/resource#servers")
        overrides[resource] = [u for u in servers.split(";") if u]
    return overrides
