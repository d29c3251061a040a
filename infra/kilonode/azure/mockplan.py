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

import base64
import contextvars
import copy
import functools
import hashlib
import json
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pulumi
from google.protobuf import json_format
from pulumi.runtime import mocks, rpc, settings
from pulumi.runtime.proto import resource_pb2
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _ensure_event_loop, _sync_await

from kilonode.azure.graph import Graph, Recorded, ordered
from kilonode.azure.sdk_shortcuts import sdk_shortcuts
from kilonode.config import Stack
from kilonode.digest import sha256_text

PROJECT = "kilonode"
MOCK_SUBSCRIPTION = "00000000-0000-0000-0000-000000000000"

# A new identity's principal ID under the mocks: this prefix and its logical name
# (kilonode.preflight.checks.identities reads it back).
MOCK_PRINCIPAL = "mock-principal-id:"
# The object ID of whoever runs `pulumi up` (authorization.getClientConfig) under the mocks.
MOCK_DEPLOYER = "mock-deployer-object-id"
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
    # What Azure assigns a new identity (GUIDs there); placeholders that say so, from the name.
    "azure-native:managedidentity:UserAssignedIdentity": {
        "clientId": "mock-client-id:{name}",
        "principalId": MOCK_PRINCIPAL + "{name}",
        "tenantId": "mock-tenant-id",
    },
}


# Which input names each azure-native resource itself (the others name its parents).
AZURE_NAME_INPUT = {
    "azure-native:storage:StorageAccount": "accountName",
    "azure-native:storage:BlobContainer": "containerName",
    "azure-native:storage:ManagementPolicy": "managementPolicyName",
    "azure-native:storage:BlobServiceProperties": "blobServicesName",
    "azure-native:storage:BlobContainerImmutabilityPolicy": "immutabilityPolicyName",
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
    "azure-native:network:PublicIPPrefix": "publicIpPrefixName",
    "azure-native:network:NatGateway": "natGatewayName",
    "azure-native:managedidentity:UserAssignedIdentity": "resourceName",
    "azure-native:authorization:RoleAssignment": "roleAssignmentName",
    "azure-native:monitor:MetricAlert": "ruleName",
    "azure-native:monitor:ActionGroup": "actionGroupName",
}


class RecordingMocks(mocks.Mocks):
    """Outputs = inputs + a plausible ID; tls outputs are placeholders. The program's
    StackReference to its own stack reads `previous_outputs`: the last deployment's stack
    outputs ({} for a stack never deployed)."""

    def __init__(self, previous_outputs: dict[str, Any] | None = None) -> None:
        self.previous_outputs = previous_outputs or {}

    def new_resource(self, args: mocks.MockResourceArgs) -> tuple[str | None, dict[str, Any]]:
        outputs = dict(args.inputs)
        if args.typ == "pulumi:pulumi:StackReference":
            return args.inputs["name"], {"name": args.inputs["name"], "outputs": self.previous_outputs,
                                         "secretOutputNames": []}
        if args.typ == "azure-native:resources:ResourceGroup":
            name = args.inputs.get("resourceGroupName", args.name)
            return f"/subscriptions/{MOCK_SUBSCRIPTION}/resourceGroups/{name}", outputs | {"name": name}
        if args.typ == "random:index/randomPassword:RandomPassword":
            # as a RandomString below; pulumi-random gives a password the ID "none"
            length = int(args.inputs.get("length", 16))
            return "none", outputs | {"result": sha256_text(f"mock:{args.name}")[:length]}
        if args.typ == "random:index/randomString:RandomString":
            # Placeholder of the right shape ([0-9a-f] fits the lower+numeric alphabet), from
            # the name: deterministic, and plainly not a secret anyone uses.
            length = int(args.inputs.get("length", 16))
            outputs["result"] = sha256_text(f"mock:{args.name}")[:length]
        if args.typ == "random:index/randomBytes:RandomBytes":
            # Placeholder bytes of the asked length, from the name (a SHA-256 per 32 bytes):
            # deterministic, the shape the consumers check (a secretbox key is 32 bytes).
            length = int(args.inputs.get("length", 32))
            raw = b"".join(hashlib.sha256(f"mock:{args.name}:{i}".encode()).digest() for i in range(-(-length // 32)))
            outputs |= {"base64": base64.b64encode(raw[:length]).decode(), "hex": raw[:length].hex()}
        identity = outputs.get("identity")
        if isinstance(identity, dict) and isinstance(identity.get("userAssignedIdentities"), list):
            # Azure takes the identities as a list of IDs and returns them as a map of ID to
            # {principalId, clientId}: the output type the SDK deserializes into.
            assigned = {i: {} for i in identity["userAssignedIdentities"]}
            outputs["identity"] = identity | {"userAssignedIdentities": assigned}
        if args.typ == "azure-native:network:PublicIPAddress":
            # Azure chooses a static address at creation: a placeholder from TEST-NET-3 (RFC 5737,
            # documentation only), from the name, so the recorded graph is the same every time.
            outputs.setdefault("ipAddress", f"203.0.113.{int(sha256_text(args.name)[:2], 16) % 254 + 1}")
        for key, template in _TLS_OUTPUTS.get(args.typ, {}).items():
            outputs[key] = template.format(name=args.name)
        if args.typ.startswith("azure-native:"):
            # Azure-native resources report their Azure name as `name`.
            own = AZURE_NAME_INPUT.get(args.typ)
            outputs.setdefault("name", args.inputs.get(own, args.name) if own else args.name)
        return f"mock:{args.typ}::{args.name}", outputs

    def call(self, args: mocks.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        if args.token == "azure-native:authorization:getClientConfig":
            # Who runs `pulumi up`: placeholders that say so (Azure returns GUIDs).
            return {"clientId": "mock-deployer-client-id", "objectId": MOCK_DEPLOYER,
                    "subscriptionId": MOCK_SUBSCRIPTION, "tenantId": "mock-tenant-id"}, []
        raise NotImplementedError(f"the program makes no provider call but getClientConfig; got {args.token}")


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
        trigger = _plain_trigger(request)
        if request.custom:
            id_, state = self.mocks.new_resource(args)
            if trigger:
                state = renewed(request.type, state, trigger)
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
                          dict(inputs), depends, tuple(request.replaceOnChanges),
                          # a provider reference is "<urn>::<id>": urn:pulumi:<stack>::<project>::<type>::<name>
                          request.provider.split("::")[3] if request.provider else None,
                          tuple(request.ignoreChanges),
                          {operation: duration for operation in ("create", "update", "delete")
                           if (duration := getattr(request.customTimeouts, operation))},
                          bool(request.deleteBeforeReplace), trigger)
        with self._lock:
            self.recorded.append((urn, record))
            self.resources[urn] = mocks.MockMonitor.ResourceRegistration(urn, id_ or "", state)
        obj = _at_once(lambda: rpc.serialize_properties(state, {}))
        return resource_pb2.RegisterResourceResponse(urn=urn, id=id_ or "", object=obj)


def _at_once(make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """The result of the coroutine `make()` gives, run to its end here when it never waits (the
    mock's state is plain data: serialising it awaits only finished futures), else awaited as
    the SDK's mock monitor does (_sync_await pumps the running event loop).

    The monitor runs on the event loop's own thread (_InlineExecutor), so the SDK's way would
    pump the loop re-entrantly from inside a registration for every resource."""
    coroutine = make()
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    return _sync_await(make())


def _plain_trigger(request: Any) -> Any:
    """The request's replacementTrigger as a plain value (None: not set)."""
    if not request.HasField("replacement_trigger"):
        return None
    value = json_format.MessageToDict(request.replacement_trigger)
    return int(value) if isinstance(value, float) and value.is_integer() else value


def renewed(type_: str, state: dict[str, Any], trigger: Any) -> dict[str, Any]:
    """A pulumi-tls resource's placeholders once its trigger is not its first value (0): what
    the engine's replacement gives, new key material, shown as the generation it belongs to. At
    0 the placeholders stay as they were, as a first deployment's do."""
    if type_ not in _TLS_OUTPUTS:
        return state
    return state | {key: f"{state[key]}#generation-{trigger}" for key in _TLS_OUTPUTS[type_] if key in state}


def cluster_value(stack: Stack) -> Any:
    """The `kilonode:cluster` value of a loaded (already validated) stack, as its file holds it:
    what the program reads through pulumi.Config under `pulumi up` (the file is not read again)."""
    return stack.raw


def run_plan(stack: Stack, program: Callable[[], object] | None = None,
             previous_outputs: dict[str, Any] | None = None) -> Graph:
    """Run the Pulumi program for `stack` under mocks and return its resource graph.

    The program reads its config through pulumi.Config exactly as under `pulumi up`; a
    fresh context keeps runs (and tests) from sharing Pulumi's global state.
    `previous_outputs` stands for the last deployment's stack outputs (none: never deployed).
    """
    if program is None:
        from kilonode.azure.program import main

        # the program reads the stack file as `pulumi up` does (kilonode.config.load.program_stack)
        program = functools.partial(main, require_recorded_addresses=False, stack_file=stack.file)
    return run_program(stack.name, cluster_value(stack), program, previous_outputs)


def run_program(stack_name: str, raw: Any, program: Callable[[], object] | None = None,
                previous_outputs: dict[str, Any] | None = None) -> Graph:
    """Run `program` (default: the Pulumi program) with `raw` as `kilonode:cluster`."""
    if program is None:
        from kilonode.azure.program import main

        # the offline preview shows a stack's graph before `kilonode allocate` too; the
        # plan's warning names the unrecorded subnets, which `pulumi up` refuses
        program = functools.partial(main, require_recorded_addresses=False)
    return contextvars.copy_context().run(_run, stack_name, raw, program, previous_outputs)


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


def _discard_pending() -> None:
    """After a failed run, drop what Pulumi's process-wide settings still track (unfinished
    outputs, RPCs, the failure): the next run in this process would await them and fail
    with this run's error."""
    with settings.SETTINGS.lock:
        pending = list(settings.SETTINGS.outputs)
        settings.SETTINGS.outputs.clear()
    for task in pending:
        task.cancel()
    settings._get_rpc_manager().clear()


def _run(stack_name: str, raw: Any, program: Callable[[], object], previous_outputs: dict[str, Any] | None) -> Graph:
    settings.ROOT.set(None)
    recorder = RecordingMocks(previous_outputs)
    monitor = RecordingMonitor(recorder)
    pulumi.runtime.set_mocks(recorder, project=PROJECT, stack=stack_name, preview=False, monitor=monitor)
    pulumi.runtime.set_all_config({f"{PROJECT}:cluster": json.dumps(raw)})
    pulumi.runtime.register_stack_transformation(_without_aliases)

    def body() -> None:
        program()

    try:
        with sdk_shortcuts(_ensure_event_loop()):
            _sync_await(run_pulumi_func(body))
    except BaseException:
        _discard_pending()
        raise
    # Under mocks the root Stack registered its (then empty) outputs before the program ran;
    # the exports are on it now: serialise them as the engine would (secrets stay wrapped).
    root = settings.get_root_resource()
    exported = root.outputs if root is not None else {}  # type: ignore[attr-defined]
    outputs = rpc.deserialize_properties(_sync_await(rpc.serialize_properties(exported, {})))
    return Graph(stack_name, ordered([r for _, r in monitor.recorded]), dict(outputs))


