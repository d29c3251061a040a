"""Check recorded resource inputs against the provider SDKs' own input types.

Under Pulumi's mock engine any input is accepted: a misspelt nested property, a wrong enum
value or a missing required field would pass `kilonode plan` and fail only in `pulumi up`.
The Python SDKs (pulumi-azure-native, pulumi-tls, pulumi-command) are generated from the
providers' schemas; their `*Args` input types carry every property's wire name, its type,
its enum and whether it is required. This walks a recorded resource's inputs against them,
at every depth, and names each problem by resource and property path.
"""

from __future__ import annotations

import collections.abc
import difflib
import enum
import importlib
import sys
import types
import typing
from typing import Any

import pulumi
import pulumi._types as pulumi_types
from pulumi.runtime import rpc

from kilonode.azure.graph import Recorded

# Properties whose SDK enum lists only some of the values Azure accepts (the service models
# them as extensible strings), each with the reason it is open.
OPEN_ENUMS: dict[str, str] = {
    # VirtualMachineSizeTypes stops at sizes of 2021 (no ND H100 v5, no D v5); Azure takes any
    # size the region offers, and the VM-size catalogue (infra/kilonode/catalog/) checks it.
    "hardwareProfile.vmSize": "VirtualMachineSizeTypes predates the sizes in the catalogue",
}

# JSON Schema's `x-kubernetes-*` extensions in a CRD's openAPIV3Schema: the Pulumi schema
# renames them `x_kubernetes_*` (a hyphen is no property name in its SDKs), but the object the
# provider sends is the apiserver's, which reads the hyphenated names; a CRD given as its
# upstream YAML (as pulumi_kubernetes.yaml.ConfigFile gives every CRD it reads) keeps them.
# Accepted under either name, checked against the same declared type.
K8S_EXTENSION_PREFIX = ("x-kubernetes-", "x_kubernetes_")

# Components (this program's own) and provider instances: no resource schema to check.
# (The kubernetes provider's inputs are checked in tests/k8s.)
COMPONENT_PREFIXES = ("kilonode:", "pulumi:providers:")


def args_class(type_token: str) -> type:
    """The SDK's input type for a resource type token, e.g. azure-native:network:Subnet."""
    package, module, name = type_token.split(":")
    root = {"azure-native": "pulumi_azure_native", "tls": "pulumi_tls", "command": "pulumi_command",
            "random": "pulumi_random", "kubernetes": "pulumi_kubernetes"}[package]
    if module.startswith("index"):  # tls:index/privateKey:PrivateKey
        sdk = importlib.import_module(root)
    else:  # kubernetes:rbac.authorization.k8s.io/v1:ClusterRole -> pulumi_kubernetes.rbac.v1
        group, _, version = module.partition("/")
        sdk = importlib.import_module(".".join([root, group.split(".")[0], *([version] if version else [])]))
    resource_cls = getattr(sdk, name)
    defining = sys.modules[resource_cls.__module__]
    found = [v for k, v in vars(defining).items()
             if isinstance(v, type) and v.__module__ == defining.__name__ and k.endswith("Args")]
    if len(found) != 1:
        raise LookupError(f"{type_token}: {len(found)} Args classes in {defining.__name__}")
    return found[0]


def problems(record: Recorded) -> list[str]:
    """Every way the record's inputs disagree with its SDK input type ([] when none)."""
    if record.type.startswith(COMPONENT_PREFIXES):
        return []
    found: list[str] = []
    _check_object(record.plain(), args_class(record.type), "", found)
    return [f"{record.type} {record.name}: {p}" for p in found]


def _unwrap_secret(value: Any) -> Any:
    if isinstance(value, dict) and value.get(rpc._special_sig_key) == rpc._special_secret_sig:
        return value["value"]
    return value


def _is_unknown(value: Any) -> bool:
    return value is None or value == rpc.UNKNOWN or (isinstance(value, str) and value.startswith("mock:"))


def _candidates(hint: Any) -> list[Any]:
    """The concrete types a hint admits, without Optional, Awaitable, Output or Input wrappers."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        out: list[Any] = []
        for arg in typing.get_args(hint):
            out.extend(_candidates(arg))
        return out
    if hint is type(None) or origin is collections.abc.Awaitable or hint is collections.abc.Awaitable:
        return []
    if hint is pulumi.Output or origin is pulumi.Output:
        return []
    return [hint]


def _check_object(value: Any, cls: type, path: str, found: list[str]) -> None:
    if not isinstance(value, dict):
        found.append(f"{path or '(inputs)'}: expected an object ({cls.__name__}), got {type(value).__name__}")
        return
    declared = pulumi_types.input_type_types(cls)
    for key, item in value.items():
        where = f"{path}.{key}" if path else key
        if key.startswith(K8S_EXTENSION_PREFIX[0]):
            key = key.replace(*K8S_EXTENSION_PREFIX).replace("-", "_")
        if key not in declared:
            close = difflib.get_close_matches(key, list(declared), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            found.append(f"{where}: not a property of {cls.__name__}{hint}")
            continue
        _check_value(item, declared[key], where, found)
    for key in sorted(pulumi_types._required_property_names(cls)):
        if key not in value:
            found.append(f"{path + '.' if path else ''}{key}: required by {cls.__name__}, missing")


def _schema_path(path: str) -> str:
    """`a.b[3].c` -> `a.b[].c`: the path with list indexes dropped, as OPEN_ENUMS names it."""
    parts = [p.split("[")[0] for p in path.split(".")]
    return ".".join(parts)


def _check_value(value: Any, hint: Any, path: str, found: list[str]) -> None:
    value = _unwrap_secret(value)
    if _is_unknown(value):
        return
    candidates = _candidates(hint)
    if not candidates or typing.Any in candidates:
        return
    literals = [arg for c in candidates if typing.get_origin(c) is typing.Literal for arg in typing.get_args(c)]
    if literals:  # apiVersion and kind of Kubernetes objects
        if value not in literals:
            found.append(f"{path}: {value!r} is not {' or '.join(map(repr, literals))}")
        return
    enums = [c for c in candidates if isinstance(c, type) and issubclass(c, enum.Enum)]
    objects = [c for c in candidates if isinstance(c, type) and pulumi_types.is_input_type(c)]
    sequences = [c for c in candidates if typing.get_origin(c) in (collections.abc.Sequence, list)]
    mappings = [c for c in candidates if typing.get_origin(c) in (collections.abc.Mapping, dict)]
    if objects:
        if len(objects) == 1:
            _check_object(value, objects[0], path, found)
        elif not any(_fits(value, cls) for cls in objects):  # a union of object types
            found.append(f"{path}: matches none of {', '.join(c.__name__ for c in objects)}")
        return
    if sequences:
        if not isinstance(value, list):
            found.append(f"{path}: expected a list, got {type(value).__name__}")
            return
        (item_hint,) = typing.get_args(sequences[0]) or (Any,)
        for i, item in enumerate(value):
            _check_value(item, item_hint, f"{path}[{i}]", found)
        return
    if mappings:
        if not isinstance(value, dict):
            found.append(f"{path}: expected a map, got {type(value).__name__}")
            return
        _, item_hint = typing.get_args(mappings[0]) or (str, Any)
        for key, item in value.items():
            _check_value(item, item_hint, f"{path}.{key}", found)
        return
    if enums and isinstance(value, str):
        allowed = {member.value for e in enums for member in e}
        if value not in allowed and _schema_path(path) not in OPEN_ENUMS:
            names = ", ".join(sorted(allowed))
            found.append(f"{path}: {value!r} is not one of {names}")
        return
    scalar = {str: str, int: (int, float), float: (int, float), bool: bool}
    for c in candidates:
        if c in scalar and isinstance(value, scalar[c]) and not (c is not bool and isinstance(value, bool)):
            if c is int and isinstance(value, float) and not value.is_integer():
                continue
            return
        if c is dict and isinstance(value, dict):
            return
    found.append(f"{path}: expected {' or '.join(getattr(c, '__name__', str(c)) for c in candidates)}, "
                 f"got {type(value).__name__} {value!r}"[:300])


def _fits(value: Any, cls: type) -> bool:
    trial: list[str] = []
    _check_object(value, cls, "", trial)
    return not trial
