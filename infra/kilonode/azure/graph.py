"""The Pulumi program's resource graph, as recorded under the mock engine: the model
(Recorded, Graph), secret masking, a stable reading order, and the text/JSON/Markdown
formats. Graph in, formats out: `kilonode plan`, the tests and the coming review tools
share it; recording lives in kilonode.azure.mockplan.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi.runtime import rpc

from kilonode.azure import join_waves
from kilonode.yamlio import block_yaml

SECRET = "[secret]"


@dataclass(frozen=True)
class Recorded:
    """One registered resource: what `kilonode plan` prints and the tests read."""

    type: str
    name: str
    parent: str | None  # the parent's name; None for children of the stack
    protect: bool
    custom: bool  # False for ComponentResources
    inputs: dict[str, Any]  # as the engine saw them; secrets still wrapped (see `masked`)
    depends_on: tuple[str, ...] = ()  # names of the resources it waits for (explicit and via inputs)
    replace_on_changes: tuple[str, ...] = ()  # input paths whose change replaces the resource
    provider: str | None = None  # the explicit provider's name (None: the default provider)
    ignore_changes: tuple[str, ...] = ()  # input paths `pulumi up` leaves to someone else (the autoscaler)
    # the customTimeouts option, operation -> duration ("create": "40m"): how long `pulumi up`
    # waits for it where the provider's default would not do (kilonode.k8s.pods.awaited)
    custom_timeouts: dict[str, str] = field(default_factory=dict)
    # the deleteBeforeReplace option: its replacement also replaces what dependsOn it (not printed)
    delete_before_replace: bool = False
    # the replacementTrigger option (None: none): a new value replaces the resource (a host's
    # certificate generation, kilonode.azure.tls)
    replacement_trigger: Any = None

    def plain(self) -> dict[str, Any]:
        """Inputs with secrets unwrapped: for tests that look inside custom data."""
        return _unwrap(self.inputs)

    def masked(self) -> dict[str, Any]:
        """Inputs with every secret replaced by `[secret]`: what is printed."""
        return _mask(self.inputs)


@dataclass
class Graph:
    stack: str
    resources: list[Recorded] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)  # the stack's exports; secrets still wrapped
    # Sections the command adds from the plan (title -> lines): what no resource's inputs say
    # in a line, such as who acts on GPU nodes with which rights (kilonode.k8s.gpu.describe).
    notes: dict[str, list[str]] = field(default_factory=dict)

    def of_type(self, type_: str) -> list[Recorded]:
        return [r for r in self.resources if r.type == type_]

    def count(self, type_: str) -> int:
        return len(self.of_type(type_))

    def named(self, name: str) -> Recorded:
        found = [r for r in self.resources if r.name == name]
        if len(found) != 1:
            raise KeyError(f"{len(found)} resources named {name!r}")
        return found[0]

    def children(self, parent: str) -> list[Recorded]:
        return [r for r in self.resources if r.parent == parent]

    def counts(self) -> dict[str, int]:
        return dict(sorted(Counter(r.type for r in self.resources).items()))

    def to_json(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "resources": [
                {"type": r.type, "name": r.name, "parent": r.parent, "protect": r.protect,
                 "replaceOnChanges": list(r.replace_on_changes),
                 **({"ignoreChanges": list(r.ignore_changes)} if r.ignore_changes else {}),
                 **({"customTimeouts": r.custom_timeouts} if r.custom_timeouts else {}), "inputs": r.masked()}
                for r in self.resources
            ],
            "counts": self.counts(),
            "outputs": _mask(self.outputs),
            **({"notes": self.notes} if self.notes else {}),
        }


def _is_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get(rpc._special_sig_key) == rpc._special_secret_sig


# The SDK marks a whole top-level input secret when anything inside it is (a VM's
# `osProfile` because of `customData`). Inside such a value these keys -- the only secret
# leaves this program creates -- are masked and the rest is shown; a secret value holding
# none of them is masked whole, so nothing secret is ever printed.
SECRET_LEAVES = frozenset({"customData", "privateKeyPem", "caPrivateKeyPem", "adminPassword", "userData"})


def _mask(value: Any) -> Any:
    if _is_secret(value):
        inner = _unwrap(value)
        return _mask_leaves(inner) if _has_secret_leaf(inner) else SECRET
    if isinstance(value, dict):
        return {k: SECRET if k in SECRET_LEAVES else _mask(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_mask(v) for v in value]
    return _plain_scalar(value)


def _has_secret_leaf(value: Any) -> bool:
    if isinstance(value, dict):
        return any(k in SECRET_LEAVES or _has_secret_leaf(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_secret_leaf(v) for v in value)
    return False


def _mask_leaves(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: SECRET if k in SECRET_LEAVES else _mask_leaves(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_leaves(v) for v in value]
    return value


def _unwrap(value: Any) -> Any:
    if _is_secret(value):
        return _unwrap(value["value"])
    if isinstance(value, dict):
        return {k: _unwrap(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    return _plain_scalar(value)


def _plain_scalar(value: Any) -> Any:
    if isinstance(value, pulumi.FileAsset):
        return {"fileAsset": value.path}
    if isinstance(value, float) and value.is_integer():
        return int(value)  # protobuf Struct numbers are doubles
    return value


# --- order and printing ----------------------------------------------------------------

# Subsystems in the order a reader follows them (the component tree at the top of docs/azure.md).
_COMPONENT_ORDER = ["Cluster", "Network", "Tls", "NodeImage", "EtcdCluster", "ControlPlane", "GpuNodePool",
                    "JoinWaves",
                    "InCluster", "ApiserverReady", "NodeBootstrap", "ServingCertApprover", "KubeProxy", "ClusterDns",
                    "CloudProvider", "DevicePlugin", "GpuHealthAccess", "RdmaDevicePlugin"]


def _natural(text: str) -> list[Any]:
    """'x-10' after 'x-9': digits compare as numbers."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text)]


def _sort_key(r: Recorded) -> tuple[Any, ...]:
    token = r.type.rsplit(":", 1)[-1]
    rank = _COMPONENT_ORDER.index(token) if r.type.startswith("kilonode:") and token in _COMPONENT_ORDER else 99
    return (r.custom, rank, r.type, _natural(r.name))


def ordered(records: list[Recorded]) -> list[Recorded]:
    """Depth first from the roots; siblings: components first (subsystem order), then
    resources by type and natural name. Independent of registration order."""
    by_parent: dict[str | None, list[Recorded]] = {}
    names = {r.name for r in records}
    for r in records:
        by_parent.setdefault(r.parent if r.parent in names else None, []).append(r)

    def walk(parent: str | None) -> Iterator[Recorded]:
        for r in sorted(by_parent.get(parent, []), key=_sort_key):
            yield r
            yield from walk(r.name)

    return list(walk(None))


def _flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            yield from _flatten(v, f"{prefix}.{k}" if prefix else k)
    elif isinstance(value, list) and value:
        for i, v in enumerate(value):
            yield from _flatten(v, f"{prefix}[{i}]")
    else:
        yield prefix, value


def _scalar(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _flags(r: Recorded, left: str, right: str) -> str:
    flags = (["protect"] if r.protect else []) + [f"replace on {path}" for path in r.replace_on_changes]
    flags += [f"ignores changes to {path}" for path in r.ignore_changes]
    flags += [f"{operation} timeout {duration}" for operation, duration in r.custom_timeouts.items()]
    if r.replacement_trigger is not None:
        flags.append(f"replaced when its trigger changes from {json.dumps(r.replacement_trigger)}")
    return f" {left}{', '.join(flags)}{right}" if flags else ""


def after_line(r: Recorded, types: dict[str, str]) -> list[str]:
    """The resources of its own type it waits for, and the join timer: an order no input
    explains (the waves of scale sets, kilonode.azure.join_waves; subnets created one at a time)."""
    peers = [name for name in r.depends_on if types.get(name) == r.type or join_waves.TIMER_MARK in name]
    return [f"    after: {', '.join(peers)}"] if peers else []


def format_text(graph: Graph) -> str:
    lines = [
        f"kilonode plan {graph.stack}: {len(graph.resources)} resources "
        "(Pulumi mock engine; nothing was sent to Azure)",
        "",
    ]
    types = {r.name: r.type for r in graph.resources}
    for r in graph.resources:
        lines.append(f"{r.type} {r.name}{_flags(r, '[', ']')}")
        lines.append(f"    parent: {r.parent or '-'}")
        lines += after_line(r, types)
        lines += [f"    {key}: {_scalar(value)}" for key, value in _flatten(r.masked()) if key]
    if graph.outputs:
        lines += ["", "Stack outputs:"]
        lines += [f"    {key}: {_scalar(value)}" for key, value in _flatten(_mask(graph.outputs)) if key]
    for title, notes in graph.notes.items():
        lines += ["", f"{title}:"]
        lines += [f"    {note}" for note in notes]
    lines += ["", "Resources per type:"]
    counts = graph.counts()
    width = max(len(t) for t in counts)
    lines += [f"  {t:<{width}}  {n:>5}" for t, n in counts.items()]
    lines.append(f"  {'total':<{width}}  {len(graph.resources):>5}")
    return "\n".join(lines) + "\n"


def format_markdown(graph: Graph) -> str:
    lines = [
        f"# kilonode plan: {graph.stack}",
        "",
        f"{len(graph.resources)} resources, from Pulumi's mock engine; nothing was sent to Azure.",
        "",
        "| type | count |",
        "|---|---:|",
    ]
    lines += [f"| `{t}` | {n} |" for t, n in graph.counts().items()]
    lines += [f"| **total** | **{len(graph.resources)}** |", ""]
    if graph.outputs:
        lines += ["## Stack outputs", "", "```"]
        lines += [f"{key}: {_scalar(value)}" for key, value in _flatten(_mask(graph.outputs)) if key]
        lines += ["```", ""]
    for title, notes in graph.notes.items():
        lines += [f"## {title}", ""]
        lines += [f"- {note}" for note in notes]
        lines.append("")
    lines += ["## Resources", ""]
    for r in graph.resources:
        lines += [f"### `{r.name}`{_flags(r, '(', ')')}", "", f"`{r.type}`, parent `{r.parent or '-'}`", ""]
        flat = [(key, value) for key, value in _flatten(r.masked()) if key]
        if flat:
            lines.append("```")
            lines += [f"{key}: {_scalar(value)}" for key, value in flat]
            lines += ["```", ""]
    return "\n".join(lines) + "\n"


def format_json(graph: Graph) -> str:
    return json.dumps(graph.to_json(), indent=2, sort_keys=True) + "\n"


RESOURCE_GRAPH_FILE = "resource-graph.txt"


def format_resource_graph(graph: Graph) -> str:
    """The golden of the Azure side (tests/golden/<stack>/resource-graph.txt): `kilonode plan`'s
    text for every resource but the Kubernetes objects (in-cluster/ holds those as YAML), one
    input per line, so a pull request shows a changed input as one changed line."""
    kept = [r for r in graph.resources if not r.type.startswith("kubernetes:")]
    return format_text(Graph(graph.stack, kept, graph.outputs, graph.notes))


IN_CLUSTER_DIR = "in-cluster"
_K8S_HEAD = ("apiVersion", "kind", "metadata")


def _manifest(r: Recorded) -> dict[str, Any]:
    """A recorded Kubernetes object as its YAML reads: apiVersion, kind, metadata first,
    the rest in name order; secrets as [secret]."""
    body = r.masked()
    return {**{k: body[k] for k in _K8S_HEAD if k in body}, **{k: body[k] for k in sorted(body) if k not in _K8S_HEAD}}


def format_manifests(graph: Graph) -> dict[str, str]:
    """The in-cluster objects as Kubernetes YAML, one multi-document file per kilonode:k8s
    component (in-cluster/<component>.yaml), in the graph's reading order: what `pulumi up`
    sends to the apiserver, for review beside the host files (tests/golden/<stack>/)."""
    prefix = f"{graph.stack}-k8s-"
    files: dict[str, list[str]] = {}
    for r in graph.resources:
        if not (r.custom and r.type.startswith("kubernetes:") and r.parent):
            continue
        component = r.parent.removeprefix(prefix)
        # the resource's options, which are no part of the object (its timeouts), beside its name
        files.setdefault(f"{IN_CLUSTER_DIR}/{component}.yaml", []).append(
            f"# {r.name}{_flags(r, '[', ']')}\n" + block_yaml(_manifest(r)))
    return {path: "---\n".join(docs) for path, docs in sorted(files.items())}
