"""The stack file described from the one source of truth, the pydantic model: its JSON Schema
(`kilonode schema`, for editor completion), the key-by-key reference (docs/stack-reference.md)
and a first stack file with every key commented (`kilonode new`)."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from ipaddress import IPv4Network
from typing import Annotated, Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from kilonode.catalog.bounds import number_range, reader
from kilonode.config import tokens
from kilonode.config.load import CONFIG_KEY
from kilonode.config.model import ClusterConfig
from kilonode.config.values import Accepts, ReadBy
from kilonode.yamlio import flow_yaml

REFERENCE_DOC = "docs/stack-reference.md"


def stack_file_schema() -> dict[str, Any]:
    """JSON Schema of a stack file: Pulumi's `config:` map with kilonode's value under CONFIG_KEY."""
    cluster = ClusterConfig.model_json_schema(by_alias=True, mode="validation")
    defs = cluster.pop("$defs", {})
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "kilonode stack file (Pulumi.<stack>.yaml)",
        "description": "A Pulumi stack config file; kilonode reads the value under config.kilonode:cluster. "
                       "Other config keys (other providers' settings) are Pulumi's and allowed.",
        "type": "object",
        "required": ["config"],
        "properties": {
            "config": {
                "type": "object",
                "required": [CONFIG_KEY],
                "properties": {CONFIG_KEY: cluster},
            },
            "secretsprovider": {"type": "string"},
            "encryptedkey": {"type": "string"},
            "encryptionsalt": {"type": "string"},
        },
        "$defs": defs,
    }


@dataclass(frozen=True)
class Key:
    path: str  # nodePools[].podsPerNode
    depth: int
    field: FieldInfo
    default: Any  # the effective default here (a section's own default instance), or PydanticUndefined
    section: type[BaseModel] | None  # the model this key opens, if it is a section
    is_list: bool  # a list of sections (nodePools[])


def _section_model(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """(model, is_list) when the annotation is a model, an optional model or a tuple of models."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is tuple and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return args[0], True
    if isinstance(annotation, types.UnionType) or origin is typing.Union:
        for arg in args:
            model, is_list = _section_model(arg)
            if model is not None:
                return model, is_list
    return None, False


def keys(model: type[BaseModel] = ClusterConfig, prefix: str = "", depth: int = 0,
         defaults: BaseModel | None = None) -> Iterator[Key]:
    """Every key of the stack's value, depth first, in the model's order."""
    for name, info in model.model_fields.items():
        alias = info.alias or name
        path = f"{prefix}{alias}"
        if defaults is not None:
            default = getattr(defaults, name)
        elif info.default_factory is not None:
            default = info.default_factory()  # type: ignore[call-arg]
        else:
            default = info.default
        section, is_list = _section_model(info.annotation)
        yield Key(path, depth, info, default, section, is_list)
        if section is not None:
            child_defaults = default if isinstance(default, BaseModel) else None
            child_prefix = f"{path}[]." if is_list else f"{path}."
            yield from keys(section, child_prefix, depth + 1, child_defaults)


def type_name(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:  # a typed value (kilonode.config.values): named by what it holds
        return type_name(args[0])
    if annotation is IPv4Network:
        return "CIDR"
    if annotation in (int, str, bool, float):
        return annotation.__name__
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if isinstance(annotation, types.UnionType) or origin is typing.Union:
        inner = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(inner) + (" (optional)" if type(None) in args else "")
    if origin is tuple:
        return f"list of {type_name(args[0])}"
    if origin is dict:
        return f"map of {type_name(args[0])} to {type_name(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return str(annotation)


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, IPv4Network):
        return str(value)
    return value


def default_text(key: Key) -> str:
    if key.default is PydanticUndefined:
        return "required"
    if key.section is not None:
        return "see below"
    value = _plain(key.default)
    if value is None:
        return "unset"
    return f"`{json.dumps(value)}`"


def _accepts(annotation: Any) -> list[str]:
    """What the typed values in `annotation` accept (values.Accepts), the innermost last."""
    found = [m.text for m in getattr(annotation, "__metadata__", ()) if isinstance(m, Accepts)][-1:]
    return found + [text for arg in typing.get_args(annotation) for text in _accepts(arg)]


def _readers(annotation: Any) -> list[str]:
    """The programs (catalog/bounds.yaml) that read the integers in `annotation` (values.ReadBy)."""
    found = [m.key for m in getattr(annotation, "__metadata__", ()) if isinstance(m, ReadBy)]
    return found + [key for arg in typing.get_args(annotation) for key in _readers(arg)]


def constraints(info: FieldInfo) -> str:
    words: list[str] = [m.text for m in info.metadata if isinstance(m, Accepts)][-1:]
    words += [] if words else list(dict.fromkeys(_accepts(info.annotation)))
    for item in info.metadata:
        for attr, symbol in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if getattr(item, attr, None) is not None:
                words.append(f"{symbol} {getattr(item, attr)}")
        if getattr(item, "min_length", None):
            words.append(f"at least {item.min_length}")
        if getattr(item, "pattern", None):
            words.append(f"matches `{item.pattern}`")
    for key in dict.fromkeys([*_readers(info.annotation), *(m.key for m in info.metadata if isinstance(m, ReadBy))]):
        words.append(f"read by {reader(key).reader} (catalog/bounds.yaml): ≤ {number_range(key)[1]}")
    return ", ".join(words)


def reference_markdown() -> str:
    """docs/stack-reference.md: every key with its type, default, constraints and reason."""
    lines = [
        "# Stack file reference",
        "",
        "<!-- Generated from infra/kilonode/config/model.py by `make golden` (kilonode.config.reference); "
        "a test keeps it current. -->",
        "",
        f"A stack file is a Pulumi stack config file (`stacks/Pulumi.<stack>.yaml`); kilonode reads the "
        f"value under `config.{CONFIG_KEY}`. It holds overrides only: every key below has its default "
        "and the reason for it. `kilonode schema` prints the same as JSON Schema for editors; "
        "`kilonode new DIR` writes a first stack with every key commented. Keys are camelCase, "
        "unknown keys are errors, and cross-field rules (odd etcd sizes, subnets inside the VNet, sizes "
        "against the catalogue, ...) are listed under `kilonode validate` in "
        "[stack-files.md](stack-files.md#commands).",
        "",
        "| key | type | default | constraints | why |",
        "|---|---|---|---|---|",
    ]
    for key in keys():
        why = (key.field.description or "").replace("|", "\\|")
        lines.append(
            f"| `{key.path}` | {type_name(key.field.annotation)} | {default_text(key)} | "
            f"{constraints(key.field)} | {why} |"
        )
    return "\n".join(lines) + "\n"


def _yaml_value(value: Any) -> str:
    return flow_yaml(_plain(value))


def starter_stack(cluster: str, stack: str) -> str:
    """A first stack file: the required keys set, every other key commented with its default
    and the reason, so a user uncomments what they change (a test uncomments them all and
    gets the same cluster)."""
    out = [
        f"# Stack '{stack}' of cluster '{cluster}', written by `kilonode new`.",
        "# Only the uncommented keys are set; every other key shows its default and why (uncomment a",
        "# section's line too when you set a key inside it). Check the stack with",
        f"# `kilonode validate {stack}`; before the first `pulumi up`, record its subnets with",
        f"# `kilonode allocate {stack}`. Every key: docs/stack-reference.md in kilonode's repository.",
        "config:",
        f"  {CONFIG_KEY}:",
    ]
    # optional sections that default to null (etcd.leases): one `# key: null` line, not their keys
    absent = tuple(f"{k.path}." for k in keys() if k.section is not None and not k.is_list and k.default is None
                   and k.path != "deployer")
    for key in keys():
        if "[]." in key.path or key.path.startswith(("deployer.", "joinTokens.", *absent)):
            # a list's items: the pool's below, other lists show as their default; the deployer's
            # below; joinTokens' keys are under "Node join credentials" in docs/azure.md; an
            # optional section's keys are in docs/stack-reference.md
            continue
        indent = "    " + "  " * key.depth
        why = key.field.description or ""
        if key.path == "name":
            out += [f"{indent}# {why}", f"{indent}name: {cluster}"]
        elif key.path == "nodePools":
            out += [f"{indent}# {why}", f"{indent}nodePools:", f"{indent}  - name: gpu", f"{indent}    nodes: 2"]
            out += _commented((k for k in keys() if k.path.startswith("nodePools[].")), indent + "    ",
                              skip={"nodePools[].name", "nodePools[].nodes"})
            # every GPU node registers with the GPU health startup taint: the cluster's own
            # workloads need an untainted pool (`kilonode validate` refuses a stack without one)
            out += [f"{indent}  # The system pool: CoreDNS and the controllers run here, not on tainted GPU nodes.",
                    f"{indent}  - name: system", f"{indent}    nodes: 3", f"{indent}    system: true",
                    f"{indent}    vmSize: Standard_D4ds_v5", f"{indent}    gpusPerNode: 0"]
        elif key.path == "joinTokens":
            # required (kilonode.config.tokens): half the longest lifetime from today, rotated before it
            expires = (tokens.now() + timedelta(days=tokens.JOIN_TOKEN_MAX_DAYS // 2)).strftime("%Y-%m-%dT00:00:00Z")
            out += [f"{indent}# {why}", f"{indent}joinTokens:",
                    f"{indent}  current: {{generation: 1, expires: \"{expires}\"}}"]
        elif key.path == "deployer":
            # preflight refuses a stack that does not say where `pulumi up` runs: a placeholder the
            # user replaces (preflight warns until then)
            out += [f"{indent}# {why}", f"{indent}deployer:", f"{indent}  network: internet",
                    f"{indent}  # 198.51.100.0/24 is a documentation range (RFC 5737): put your runner's egress "
                    "addresses here",
                    f"{indent}  cidrs: [198.51.100.0/24]"]
        else:
            out += _commented([key], "    " + "  " * key.depth, skip=set(), relative=False)
    return "\n".join(out) + "\n"


def _commented(entries: typing.Iterable[Key], indent: str, skip: set[str], relative: bool = True) -> list[str]:
    lines = []
    absent: list[str] = []  # optional sections (default null): their keys stay out of the starter
    for key in entries:
        # a list inside a list (a pool's preloadImages) shows as its default, without its items
        if key.path in skip or key.path.count("[].") > 1 or key.default is PydanticUndefined:
            continue
        if any(key.path.startswith(f"{prefix}.") for prefix in absent):
            continue
        pad = indent + ("  " * (key.depth - 1) if relative else "")
        name = key.path.rsplit(".", 1)[-1]
        why = key.field.description or ""
        if key.section is not None and not key.is_list and key.default is None:
            # uncommented, `null` keeps it off; its keys are in docs/stack-reference.md
            absent.append(key.path)
            lines.append(f"{pad}# {name}: null  # {why} Keys: docs/stack-reference.md.")
        elif key.section is not None and not key.is_list:
            lines.append(f"{pad}# {name}:  # {why}")
        else:
            lines.append(f"{pad}# {name}: {_yaml_value(key.default)}  # {why}")
    return lines
