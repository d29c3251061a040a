"""No stack value can add a line or a shell token to a rendered file (issue 24).

For every string the stack model holds, hostile strings (line breaks of every kind, quotes,
`$`, backticks, `;`, NUL and other control characters, `%` for systemd's specifiers, spaces)
go into the `local` stack at that field. Either loading refuses the value, naming the field, or
rendering the stack gives files with exactly the lines and words, and in shell scripts the
tokens, that a benign value of the same length gives.

Every string field of the model is listed here, as reaching a rendered file (FIELDS) or not
(NOT_RENDERED, with why): a new field fails test_every_string_field_is_covered until it is.
"""

from __future__ import annotations

import copy
import re
import shlex
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from kilonode.config import stack_from_value
from kilonode.config.model import ClusterConfig
from kilonode.plan import plan_stack
from kilonode.problems import StackError
from kilonode.render import render_tree
from tests.conftest import shipped_cluster_value

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

# characters that end a line for some reader (Python's str.splitlines, YAML, JavaScript, ...),
# that a shell or systemd reads as syntax, and control characters
HOSTILE = ("\n", "\r", "\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x00", "\x1b", "\t", " ", "'", '"', "`", "$",
           "$(", "${", ";", "&", "|", "<", ">", "%", "%n", "\\", "*", "?", "#", "=", ",", ":", "{", "}", "\u202e")
BENIGN = tuple("abcxyz019._-/")
PAYLOADS = ("x\nExecStartPre=/bin/sh -c id", "$(reboot)", "`id`", "a;reboot", "a' ; id '", 'a" ; id "',
            "1\nkernel.core_pattern = |/bin/sh", "%h%n", "a\u2028b", "a\x85b", "a\x00b", "a b", "--x=1")


@dataclass(frozen=True)
class Field:
    """Where a string goes in the stack: `put` sets it into a copy of the cluster value;
    `prefix` makes generated values look like the field's own (a path's '/mnt/') so that they
    get past the first check; `path` is the field path a refusal must name (or start with)."""

    path: str
    put: Callable[[dict[str, Any], str], None]
    prefix: str = ""


def _at(*loc: str | int) -> Callable[[dict[str, Any], str], None]:
    def put(cluster: dict[str, Any], value: str) -> None:
        node = cluster
        for part in loc[:-1]:
            node = node.setdefault(part, {}) if isinstance(part, str) else node[part]
        node[loc[-1]] = value

    return put


def _with(key: str, entry: Callable[[str], Any]) -> Callable[[dict[str, Any], str], None]:
    """Set `key` of the first pool (or a top-level key) to entry(value)."""

    def put(cluster: dict[str, Any], value: str) -> None:
        if key.startswith("pool."):
            cluster["nodePools"][0][key[len("pool."):]] = entry(value)
        else:
            cluster[key] = entry(value)

    return put


TEAM = {"name": "vision", "pool": "cpu", "nodes": 1}


def _team(field: str, entry: Callable[[str], Any]) -> Callable[[dict[str, Any], str], None]:
    def put(cluster: dict[str, Any], value: str) -> None:
        team = dict(TEAM)
        if field == "nodeSelector":
            team.pop("pool")
        team[field] = entry(value)
        cluster["teams"] = [team]

    return put


FIELDS: dict[str, Field] = {
    "name": Field("name", _at("name"), "a"),
    "location": Field("location", _at("location"), "westus"),
    "zones[]": Field("zones", _with("zones", lambda v: [v])),
    "kubernetesVersion": Field("kubernetesVersion", _at("kubernetesVersion"), "1.34."),
    "nodePools[].kubernetesVersion": Field("nodePools[0].kubernetesVersion", _at("nodePools", 0, "kubernetesVersion"),
                                           "1.34."),
    "controlPlaneEmulatedVersion": Field("controlPlaneEmulatedVersion", _at("controlPlaneEmulatedVersion"), "1."),
    "pauseImage": Field("pauseImage", _at("pauseImage"), "registry.k8s.io/pause:"),
    "etcd.main.vmSize": Field("etcd.main.vmSize", _at("etcd", "main", "vmSize"), "Standard_D"),
    "etcd.main.vmSizeOverrides{}": Field("etcd.main.vmSizeOverrides", _at("etcd", "main", "vmSizeOverrides", 0),
                                         "Standard_D"),
    "etcd.main.localDisk.device": Field("etcd.main.localDisk.device", _at("etcd", "main", "localDisk", "device"),
                                        "/dev/"),
    "etcd.main.localDisk.mountPoint": Field("etcd.main.localDisk.mountPoint",
                                            _at("etcd", "main", "localDisk", "mountPoint"), "/mnt/"),
    "etcd.main.autoCompactionRetention": Field("etcd.main.autoCompactionRetention",
                                               _at("etcd", "main", "autoCompactionRetention"), "1"),
    "etcd.events.localDisk.mountPoint": Field("etcd.events.localDisk.mountPoint",
                                              _at("etcd", "events", "localDisk", "mountPoint"), "/mnt/"),
    "apiserver.vmSize": Field("apiserver.vmSize", _at("apiserver", "vmSize"), "Standard_D"),
    "apiserver.auditLog.path": Field("apiserver.auditLog.path", _at("apiserver", "auditLog", "path"), "/var/log/"),
    "apiserver.localDisk.device": Field("apiserver.localDisk.device", _at("apiserver", "localDisk", "device"), "/dev/"),
    "apiserver.localDisk.mountPoint": Field("apiserver.localDisk.mountPoint",
                                            _at("apiserver", "localDisk", "mountPoint"), "/mnt/"),
    "nodePools[].name": Field("nodePools[0].name", _at("nodePools", 0, "name"), "a"),
    "nodePools[].vmSize": Field("nodePools[0].vmSize", _at("nodePools", 0, "vmSize"), "Standard_D"),
    "nodePools[].localDisk.device": Field("nodePools[0].localDisk.device",
                                          _at("nodePools", 0, "localDisk", "device"), "/dev/"),
    "nodePools[].localDisk.mountPoint": Field("nodePools[0].localDisk.mountPoint",
                                              _at("nodePools", 0, "localDisk", "mountPoint"), "/mnt/"),
    "nodePools[].imagePullProgressDeadline": Field("nodePools[0].imagePullProgressDeadline",
                                                   _at("nodePools", 0, "imagePullProgressDeadline"), "3"),
    "nodePools[].preloadImages[].image": Field("nodePools[0].preloadImages[0].image",
                                               _with("pool.preloadImages", lambda v: [{"image": v}]), "example.com/"),
    "nodePools[].labels{key}": Field("nodePools[0].labels", _with("pool.labels", lambda v: {v: "x"}), "example.com/"),
    "nodePools[].labels{}": Field("nodePools[0].labels", _with("pool.labels", lambda v: {"example.com/a": v}), "a"),
    "nodePools[].taints[]": Field("nodePools[0].taints", _with("pool.taints", lambda v: [v]), "example.com/a="),
    "sysctl.profile": Field("sysctl.profile", _at("sysctl", "profile"), "gpu-"),
    "sysctl.overrides{key}": Field("sysctl.overrides", _at("sysctl", "overrides", "x"), ""),
    "sysctl.overrides{}": Field("sysctl.overrides", _at("sysctl", "overrides", "net.core.default_qdisc"), "f"),
    "bootImageArchives[].image": Field("bootImageArchives[0].image",
                                       _with("bootImageArchives", lambda v: [{"image": v, "archive": "a.tar",
                                                                              "imageId": "sha256:" + "e" * 64}]),
                                       "registry.k8s.io/"),
    "nodeImage.version": Field("nodeImage.version", _at("nodeImage", "version"), "1.0."),
    "etcdImage.version": Field("etcdImage.version", _at("etcdImage", "version"), "1.0."),
    "controlPlaneImage.version": Field("controlPlaneImage.version", _at("controlPlaneImage", "version"), "1.0."),
    "nodeImage.previous": Field("nodeImage.previous", _at("nodeImage", "previous"), "0.9."),
    "etcdImage.previous": Field("etcdImage.previous", _at("etcdImage", "previous"), "0.9."),
    "controlPlaneImage.previous": Field("controlPlaneImage.previous", _at("controlPlaneImage", "previous"), "0.9."),
    "nodeImage.pools{}": Field("nodeImage.pools", _at("nodeImage", "pools", "cpu", "version"), "1.1."),
    "nodeImage.pools{key}": Field("nodeImage.pools", lambda cluster, v: cluster.update(
        nodeImage={"pools": {v: {"version": "1.1.0"}}}), "cpu"),
    "teams[].name": Field("teams[0].name", _team("name", lambda v: v), "a"),
    "teams[].pool": Field("teams[0].pool", _team("pool", lambda v: v), "c"),
    "teams[].nodeSelector{key}": Field("teams[0].nodeSelector", _team("nodeSelector", lambda v: {v: "cpu"}),
                                       "kilonode.io/"),
    "teams[].nodeSelector{}": Field("teams[0].nodeSelector", _team("nodeSelector", lambda v: {"kilonode.io/pool": v}),
                                    "c"),
}


def _override_key(cluster: dict[str, Any], value: str) -> None:
    cluster.setdefault("sysctl", {})["overrides"] = {value: 1}


FIELDS["sysctl.overrides{key}"] = Field("sysctl.overrides", _override_key, "net.ipv4.")

NOT_RENDERED = {
    # the archive's path is read by the image build only; RelativePath keeps it inside the project
    "nodePools[].preloadImages[].archive": "read by the image build, never rendered",
    "bootImageArchives[].archive": "read by the image build, never rendered",
    "bootImageArchives[].imageId": "checked by the image build against the archive (a sha256 pattern), never rendered",
    # an Azure resource ID, passed to the Pulumi program as an input, never to a host
    "deployer.vnetId": "an Azure resource ID for the Pulumi program, never rendered",
    # a control-plane host's name, matched whole by a strict pattern (etcd-main-N, ...) and looked
    # up among the plan's hosts; only its generation, a number, reaches the Pulumi program
    "certificateGenerations{key}": "a host name looked up in the plan, never rendered",
    # VM size names (VmSize's pattern), each matched against the sizes the stack uses
    "sizesConfirmedInLocation[]": "size names matched against the stack's own sizes, never rendered",
    # registry hosts (RegistryHost's pattern), matched against the hosts of the stack's image names
    "trustedImagePrefixes[]": "image-name prefixes matched against the stack's image names, never rendered",


    # operators' public keys: an Azure input (osProfile...ssh.publicKeys), written to authorized_keys by
    # Azure; SshPublicKey refuses options, line breaks and control characters
    "sshKeys{}": "Azure's osProfile input, never rendered",
    "sshKeys{key}": "a role name, checked against the stack's roles, never rendered",
    # Alertmanager's webhook: a value of alertmanager.yml, a ConfigMap built as data and serialised
    # (kilonode.render.alertmanager), never a host's file; https with a host, no spaces or '{{'
    "alerting.webhookUrl": "a value in alertmanager.yml (built as data), never a host's file",
    "alerting.heartbeatUrl": "a value in alertmanager.yml (built as data), never a host's file",
    # an Azure input (the action group's emailReceivers), never rendered; AlertingConfig checks its form
    "alerting.azureAlertEmails[]": "Azure's action group input, never rendered",
}


def _string_fields(model: type[BaseModel] = ClusterConfig, prefix: str = "") -> set[str]:
    """Every place the model holds a free string: `a.b`, `a[]` (a list's items), `a{}` (a
    map's values), `a{key}` (a map's keys)."""
    found: set[str] = set()
    for name, info in model.model_fields.items():
        found |= _strings_in(info.annotation, f"{prefix}{info.alias or name}")
    return found


def _strings_in(annotation: Any, path: str) -> set[str]:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return _strings_in(args[0], path)
    if annotation is str:
        return {path}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _string_fields(annotation, f"{path}.")
    if isinstance(annotation, types.UnionType) or origin is typing.Union:
        return set().union(*(_strings_in(a, path) for a in args))
    if origin is tuple:
        inner = args[0]
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            return _string_fields(inner, f"{path}[].")
        return {p.replace(path, f"{path}[]", 1) for p in _strings_in(inner, path)}
    if origin is dict:
        keys = {f"{path}{{key}}"} if _strings_in(args[0], path) else set()
        return keys | ({f"{path}{{}}"} if _strings_in(args[1], path) else set())
    if origin is Literal:
        return set()
    return set()


def test_every_string_field_is_covered() -> None:
    fields = _string_fields()
    assert fields, "no string field found: the walker is broken"
    # etcd.events' and etcd.leases' fields are etcd.main's (one model, the leases one a subclass
    # that changes only the members' default and bounds); only some are exercised for each
    covered = set(FIELDS) | set(NOT_RENDERED) | {f.replace("etcd.main.", f"etcd.{other}.") for f in FIELDS
                                                 for other in ("events", "leases")}
    assert fields <= covered, sorted(fields - covered)


def _base() -> dict[str, Any]:
    return shipped_cluster_value("local")


def _loaded(cluster: dict[str, Any]) -> Any:
    return stack_from_value("local", copy.deepcopy(cluster), Path("Pulumi.local.yaml"))


@cache
def _rendered(field: str, value: str) -> dict[str, str]:
    cluster = _base()
    FIELDS[field].put(cluster, value)
    stack = _loaded(cluster)
    return {path: file.content for path, file in render_tree(stack.config, plan_stack(stack)).items()}


def _benign(field: str, value: str) -> str:
    """A value the field accepts, as long as `value` (spaces kept where they are, for the one
    field that takes words)."""
    length = len(value)
    for candidate in (
        FIELDS[field].prefix + re.sub(r"[^ /]", "a", value[len(FIELDS[field].prefix):]),
        re.sub(r"[^ ]", "1", value),
        FIELDS[field].prefix + "a" * (length - len(FIELDS[field].prefix)),
        "a" * length,
    ):
        try:
            _rendered(field, candidate)
        except StackError:
            continue
        return candidate
    return value  # nothing benign of that length: compare with itself (the value is accepted anyway)


def _tokens(script: str) -> list[str]:
    return shlex.split(script, comments=True, posix=True)


def _shape(files: dict[str, str], value: str, benign: str,
           known: frozenset[str] = frozenset()) -> dict[str, tuple[int, int, int, int]]:
    """Per file (the value replaced by the benign one in its path, unless the path is one the
    benign render has as it is: a short value like 'ab' is also part of paths it never named,
    such as nftables): its lines (as '\\n' and as str.splitlines, which also breaks at U+2028,
    NEL, ...), its words, and a shell script's tokens."""
    shape = {}
    for path, content in files.items():
        script = content.startswith("#!/bin/sh") or content.startswith("#!/bin/bash")
        key = _renamed(path, value, benign, known)
        shape[key] = (content.count("\n"), len(content.splitlines()), len(content.split()),
                                              len(_tokens(content)) if script else 0)
    return shape


def _renamed(path: str, value: str, benign: str, known: frozenset[str]) -> str:
    """`path` with the value replaced by the benign one: everywhere, or only in its host folder
    where that is the path the benign render has (value 'ab' is also inside
    'kilonode-pod-traffic-table.service', which is no name of the value's)."""
    if path in known:
        return path
    head, slash, rest = path.partition("/")
    everywhere = path.replace(value, benign)
    for candidate in (everywhere, head.replace(value, benign) + slash + rest):
        if candidate in known:
            return candidate
    return everywhere


def _hostile(prefix: str) -> st.SearchStrategy[str]:
    pieces = st.lists(st.sampled_from(HOSTILE + BENIGN), min_size=1, max_size=12).map("".join)
    return st.one_of(st.sampled_from(PAYLOADS), pieces).map(lambda text: prefix + text)


@pytest.mark.parametrize("field", sorted(FIELDS))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_hostile_value_is_refused_or_rendered_as_one_word(field: str, data: st.DataObject) -> None:
    spec = FIELDS[field]
    value = data.draw(_hostile(spec.prefix), label="value")
    cluster = _base()
    spec.put(cluster, value)
    try:
        plan_stack(_loaded(cluster))  # the plan refuses some values too (a pool no team names)
    except StackError as error:
        paths = [p.path for p in error.problems]
        assert any(path == spec.path or path.startswith(f"{spec.path}.") or path.startswith(f"{spec.path}[")
                   for path in paths), (value, [p.format("") for p in error.problems])
        assert all("\n" not in p.format("") and len(p.format("")) < 1000 for p in error.problems)
        event("refused")
        return
    event("accepted")  # `pytest --hypothesis-show-statistics` shows how often each happens
    benign = _benign(field, value)
    plain = _rendered(field, benign)
    assert _shape(_rendered(field, value), value, benign, frozenset(plain)) == _shape(plain, benign, benign), value
