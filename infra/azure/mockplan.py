"""Run the Pulumi program under Pulumi's own mock engine and record the resource graph.

No cloud, no credentials, no provider plugins: `pulumi.runtime.set_mocks` replaces the
engine, and `RecordingMonitor` writes down every registration (type, name, parent, protect,
inputs). Providers' outputs are echoed inputs plus an ID; pulumi-tls resources return
labelled placeholders, never key material, so a plan can be shared and diffed.

    >>> graph = run_plan(load_stack("research-7500"))
    >>> graph.count("azure-native:compute:VirtualMachineScaleSet")
    75
"""

from __future__ import annotations

import contextvars
import copy
import functools
import json
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pulumi
import yaml
from pulumi.runtime import mocks, rpc, settings
from pulumi.runtime.proto import resource_pb2
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from kilonode.config import Stack
from kilonode.config.load import CONFIG_KEY

SECRET = "[secret]"
PROJECT = "kilonode"
MOCK_SUBSCRIPTION = "00000000-0000-0000-0000-000000000000"

# Placeholders for pulumi-tls outputs: recognisably fake, never PEM.
_TLS_OUTPUTS = {
    "tls:index/privateKey:PrivateKey": {
        "privateKeyPem": "mock-private-key:{name}",
        "privateKeyOpenssh": "mock-private-key-openssh:{name}",
        "privateKeyPemPkcs8": "mock-private-key-pkcs8:{name}",
        "publicKeyPem": "mock-public-key:{name}",
        "publicKeyOpenssh": "ssh-rsa bW9jaw== mock:{name}",
    },
    "tls:index/selfSignedCert:SelfSignedCert": {"certPem": "mock-certificate:{name}"},
    "tls:index/locallySignedCert:LocallySignedCert": {"certPem": "mock-certificate:{name}"},
    "tls:index/certRequest:CertRequest": {"certRequestPem": "mock-certificate-request:{name}"},
}


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
                {"type": r.type, "name": r.name, "parent": r.parent, "protect": r.protect, "inputs": r.masked()}
                for r in self.resources
            ],
            "counts": self.counts(),
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


# Which input names each azure-native resource itself (the others name its parents).
_AZURE_NAME_INPUT = {
    "azure-native:storage:StorageAccount": "accountName",
    "azure-native:storage:BlobContainer": "containerName",
    "azure-native:compute:Gallery": "galleryName",
    "azure-native:compute:GalleryImage": "galleryImageName",
    "azure-native:compute:GalleryImageVersion": "galleryImageVersionName",
    "azure-native:compute:VirtualMachine": "vmName",
    "azure-native:compute:VirtualMachineScaleSet": "vmScaleSetName",
    "azure-native:network:VirtualNetwork": "virtualNetworkName",
    "azure-native:network:Subnet": "subnetName",
    "azure-native:network:NetworkSecurityGroup": "networkSecurityGroupName",
    "azure-native:network:NetworkInterface": "networkInterfaceName",
    "azure-native:network:LoadBalancer": "loadBalancerName",
    "azure-native:network:PublicIPAddress": "publicIpAddressName",
}


class RecordingMocks(mocks.Mocks):
    """Outputs = inputs + a plausible ID; tls outputs are placeholders."""

    def new_resource(self, args: mocks.MockResourceArgs) -> tuple[str | None, dict[str, Any]]:
        outputs = dict(args.inputs)
        if args.typ == "azure-native:resources:ResourceGroup":
            name = args.inputs.get("resourceGroupName", args.name)
            return f"/subscriptions/{MOCK_SUBSCRIPTION}/resourceGroups/{name}", outputs | {"name": name}
        for key, template in _TLS_OUTPUTS.get(args.typ, {}).items():
            outputs[key] = template.format(name=args.name)
        if args.typ.startswith("azure-native:"):
            # Azure-native resources report their Azure name as `name`.
            own = _AZURE_NAME_INPUT.get(args.typ)
            outputs.setdefault("name", args.inputs.get(own, args.name) if own else args.name)
        return f"mock:{args.typ}::{args.name}", outputs

    def call(self, args: mocks.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        raise NotImplementedError(f"the program makes no provider calls; got {args.token}")


class RecordingMonitor(mocks.MockMonitor):
    """MockMonitor that records each registration with its parent and protect flag, and
    marks `additionalSecretOutputs` secret as the real engine does."""

    def __init__(self, recorder: RecordingMocks) -> None:
        super().__init__(recorder)
        self.recorded: list[tuple[str, Recorded]] = []
        self._lock = threading.Lock()

    def RegisterResource(self, request: Any) -> Any:
        urn = self.make_urn(request.parent, request.type, request.name)
        if request.type == "pulumi:pulumi:Stack":
            return resource_pb2.RegisterResourceResponse(urn=urn)
        mocks._ensure_event_loop()
        inputs = rpc.deserialize_properties(request.object)
        args = mocks.MockResourceArgs(
            typ=request.type, name=request.name, inputs=inputs, provider=request.provider,
            resource_id=request.importId, custom=request.custom or False,
        )
        if request.custom:
            id_, state = self.mocks.new_resource(args)
        else:
            id_, state = None, {}
        for key in request.additionalSecretOutputs:
            if key in state:
                state[key] = rpc.wrap_rpc_secret(state[key])
        # A URN is urn:pulumi:<stack>::<project>::<type chain>::<name>; the stack is no parent.
        parent_parts = request.parent.split("::") if request.parent else []
        parent = parent_parts[-1] if parent_parts and parent_parts[2] != "pulumi:pulumi:Stack" else None
        depends = tuple(sorted({urn.split("::")[-1] for urn in request.dependencies}))
        record = Recorded(request.type, request.name, parent, bool(request.protect), bool(request.custom),
                          dict(inputs), depends)
        with self._lock:
            self.recorded.append((urn, record))
            self.resources[urn] = mocks.MockMonitor.ResourceRegistration(urn, id_ or "", state)
        obj = _sync_await(rpc.serialize_properties(state, {}))
        return resource_pb2.RegisterResourceResponse(urn=urn, id=id_ or "", object=obj)


def cluster_value(stack: Stack) -> Any:
    """The raw `kilonode:cluster` value of a loaded (already validated) stack file."""
    return yaml.safe_load(stack.file.read_text())["config"][CONFIG_KEY]


def run_plan(stack: Stack, program: Callable[[], object] | None = None) -> Graph:
    """Run the Pulumi program for `stack` under mocks and return its resource graph.

    The program reads its config through pulumi.Config exactly as under `pulumi up`; a
    fresh context keeps runs (and tests) from sharing Pulumi's global state.
    """
    return run_program(stack.name, cluster_value(stack), program)


def run_program(stack_name: str, raw: Any, program: Callable[[], object] | None = None) -> Graph:
    """Run `program` (default: the Pulumi program) with `raw` as `kilonode:cluster`."""
    if program is None:
        from kilonode.azure.program import main

        # the offline preview shows a stack's graph before `kilonode allocate` too; the
        # plan's warning names the unrecorded subnets, which `pulumi up` refuses
        program = functools.partial(main, require_recorded_addresses=False)
    return contextvars.copy_context().run(_run, stack_name, raw, program)


def _without_aliases(args: pulumi.ResourceTransformationArgs) -> pulumi.ResourceTransformationResult:
    """Drop `aliases` before the SDK resolves them, under the mock engine only.

    azure-native declares ~40 aliases per resource type (its older API-version type
    tokens) so state written by older providers migrates without replacement. They are
    URNs for the engine, not part of the graph this plan shows, and resolving them took
    about half of a research-7500 plan's run time. `pulumi up` runs with them untouched.
    """
    opts = copy.copy(args.opts)
    opts.aliases = None
    return pulumi.ResourceTransformationResult(args.props, opts)


def _run(stack_name: str, raw: Any, program: Callable[[], object]) -> Graph:
    settings.ROOT.set(None)
    recorder = RecordingMocks()
    monitor = RecordingMonitor(recorder)
    pulumi.runtime.set_mocks(recorder, project=PROJECT, stack=stack_name, preview=False, monitor=monitor)
    pulumi.runtime.set_all_config({f"{PROJECT}:cluster": json.dumps(raw)})
    pulumi.runtime.register_stack_transformation(_without_aliases)

    def body() -> None:
        program()

    _sync_await(run_pulumi_func(body))
    return Graph(stack_name, _ordered([r for _, r in monitor.recorded]))


# --- order and printing ----------------------------------------------------------------

# Subsystems in the order a reader follows them (docs/architecture.md).
_COMPONENT_ORDER = ["Cluster", "Network", "Tls", "NodeImage", "EtcdCluster", "ControlPlane", "GpuNodePool"]


def _natural(text: str) -> list[Any]:
    """'x-10' after 'x-9': digits compare as numbers."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text)]


def _sort_key(r: Recorded) -> tuple[Any, ...]:
    token = r.type.rsplit(":", 1)[-1]
    rank = _COMPONENT_ORDER.index(token) if r.type.startswith("kilonode:") and token in _COMPONENT_ORDER else 99
    return (r.custom, rank, r.type, _natural(r.name))


def _ordered(records: list[Recorded]) -> list[Recorded]:
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


def format_text(graph: Graph) -> str:
    lines = [
        f"kilonode plan {graph.stack}: {len(graph.resources)} resources "
        "(Pulumi mock engine; nothing was sent to Azure)",
        "",
    ]
    for r in graph.resources:
        flags = " [protect]" if r.protect else ""
        lines.append(f"{r.type} {r.name}{flags}")
        lines.append(f"    parent: {r.parent or '-'}")
        lines += [f"    {key}: {_scalar(value)}" for key, value in _flatten(r.masked()) if key]
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
    lines += [f"| **total** | **{len(graph.resources)}** |", "", "## Resources", ""]
    for r in graph.resources:
        flags = " (protect)" if r.protect else ""
        lines += [f"### `{r.name}`{flags}", "", f"`{r.type}`, parent `{r.parent or '-'}`", ""]
        flat = [(key, value) for key, value in _flatten(r.masked()) if key]
        if flat:
            lines.append("```")
            lines += [f"{key}: {_scalar(value)}" for key, value in flat]
            lines += ["```", ""]
    return "\n".join(lines) + "\n"


def format_json(graph: Graph) -> str:
    return json.dumps(graph.to_json(), indent=2, sort_keys=True) + "\n"
