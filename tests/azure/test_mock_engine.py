"""What kilonode.azure.mockplan swaps in the SDK for a plan's speed keeps the SDK's answers:
the dependency-cycle check refuses the same edges, and a cyclic program still fails with the
SDK's own error."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import re
import typing
from typing import Any

import pulumi
import pulumi._types as pulumi_types
import pulumi_random as random
import pytest
from google.protobuf import struct_pb2
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pulumi.output import Unknown
from pulumi.runtime import resource as sdk_resource
from pulumi.runtime import resource_cycle_breaker as sdk_cycles
from pulumi.runtime import rpc
from pulumi_azure_native import compute

from kilonode.azure import mockplan, sdk_shortcuts
from kilonode.azure.mockplan import run_plan, run_program
from kilonode.azure.sdk_shortcuts import _CycleBreaker
from kilonode.config import load_stack
from kilonode.paths import REPO_ROOT

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not


class Node:
    """Stands in for a resource: the SDK's check only keeps attributes on it."""


@settings(max_examples=300, deadline=None)
@given(edges=st.lists(st.tuples(st.integers(0, 11), st.integers(0, 11)), max_size=80))
def test_the_cycle_check_refuses_exactly_the_edges_the_sdks_refuses(edges: list[tuple[int, int]]) -> None:
    sdk_nodes, our_nodes = [Node() for _ in range(12)], [Node() for _ in range(12)]
    ours = _CycleBreaker()
    for a, b in edges:
        assert ours.declare_dependency(our_nodes[a], our_nodes[b]) == sdk_cycles.declare_dependency(
            sdk_nodes[a], sdk_nodes[b]), (a, b)


def test_a_program_with_a_dependency_cycle_still_fails_with_the_sdks_error() -> None:
    def program() -> None:
        component = pulumi.ComponentResource("test:index:Group", "group")
        random.RandomString("a", length=4, opts=pulumi.ResourceOptions(parent=component))
        # a child waiting on its own parent waits on itself
        random.RandomString("b", length=4, opts=pulumi.ResourceOptions(parent=component, depends_on=[component]))

    with pytest.raises(RuntimeError, match="circular dependency involving a resource of type "
                                           "random:index/randomString:RandomString named b"):
        run_program("local", {}, program)
    # and the next run in this process is not disturbed by it
    assert [r.name for r in run_program("local", {}, lambda: random.RandomString("c", length=4)).resources] == ["c"]


# What sdk_shortcuts._fast_sdk_paths swaps in, against the SDK's own functions.

def _ordered(value: Any) -> Any:
    """`value` with every dict as a list of its items, in order: equal only if the order is."""
    if isinstance(value, dict):
        return [(type(value).__name__, k, _ordered(v)) for k, v in value.items()]
    if isinstance(value, list | tuple):
        return [type(value).__name__, *[_ordered(v) for v in value]]
    if isinstance(value, Unknown):  # a new one each time
        return ("Unknown",)
    return type(value).__name__, value


def _exchange(request: Any, response: Any) -> tuple[bytes, bytes, bytes]:
    """A registration as bytes: the request's inputs and the answer as they are (their maps in
    the order they were filled), the rest of the request with what is a set sorted (the URNs it
    depends on: set order follows object ids, which differ from run to run) and without the
    caller's stack (the SDK sends none once the run starts: only the root stack has one)."""
    rest = type(request)()
    rest.CopyFrom(request)
    rest.ClearField("object")
    rest.ClearField("stackTrace")
    rest.ClearField("sourcePosition")
    rest.dependencies[:] = sorted(rest.dependencies)
    for deps in rest.propertyDependencies.values():
        deps.urns[:] = sorted(deps.urns)
    return request.object.SerializeToString(), rest.SerializeToString(deterministic=True), response.SerializeToString()


def _captured_run(monkeypatch: pytest.MonkeyPatch, fast: bool) -> tuple[dict[str, tuple[bytes, bytes, bytes]], Any]:
    """research-2500 under the mock engine: each registration (_exchange) by URN, and the
    graph's JSON; with the fast paths swapped in or not."""
    exchanged: dict[str, tuple[bytes, bytes, bytes]] = {}
    register = mockplan.RecordingMonitor.RegisterResource

    def recording(self: mockplan.RecordingMonitor, request: Any) -> Any:
        response = register(self, request)
        exchanged[response.urn] = _exchange(request, response)
        return response

    with monkeypatch.context() as patch:
        patch.setattr(mockplan.RecordingMonitor, "RegisterResource", recording)
        if not fast:
            patch.setattr(sdk_shortcuts, "_fast_sdk_paths", lambda properties: contextlib.nullcontext())
        graph = run_plan(load_stack("research-2500"))
    return exchanged, graph.to_json()


def test_the_fast_paths_send_and_answer_byte_for_byte_what_the_sdks_own_do(monkeypatch: pytest.MonkeyPatch) -> None:
    ours, our_graph = _captured_run(monkeypatch, fast=True)
    sdks, sdk_graph = _captured_run(monkeypatch, fast=False)
    assert ours.keys() == sdks.keys()
    assert [urn for urn in ours if ours[urn] != sdks[urn]] == []
    assert our_graph == sdk_graph
    # and they were swapped in, and put back after the run
    assert rpc.serialize_property is SDK_FUNCTIONS["serialize_property"]
    assert rpc.deserialize_properties is SDK_FUNCTIONS["deserialize_properties"]
    assert pulumi_types.unwrap_type is SDK_FUNCTIONS["unwrap_type"]


SDK_CREATE_URN = sdk_resource.create_urn  # the run swaps the module's own for its own
SDK_FUNCTIONS = {"serialize_property": rpc.serialize_property, "deserialize_properties": rpc.deserialize_properties,
                 "unwrap_type": pulumi_types.unwrap_type}

# plain keys, internal ones, and Args properties' Python names (which the SDK renames: disk_size_gb -> diskSizeGB)
_KEYS = st.sampled_from(["a", "b", "name", "__internal", "__provider", "zz", "k1", "location", "value", "disk_size_gb",
                         "create_option", "ip_configurations", "private_ip_address_version", "storage_account_type",
                         "mode", "capacity"])
_LEAVES = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False), st.integers(-2**40, 2**40).map(float),
                    st.text(max_size=8), st.just(rpc.UNKNOWN))
_JSON = st.recursive(_LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(_KEYS, inner, max_size=5),
    inner.map(lambda v: {rpc._special_sig_key: rpc._special_secret_sig, "value": v})), max_leaves=25)


@settings(max_examples=300, deadline=None)
@given(value=st.dictionaries(_KEYS, _JSON, max_size=6), keep_unknowns=st.sampled_from([None, True, False]),
       keep_internal=st.sampled_from([None, True, False]))
def test_the_struct_reader_gives_the_sdks_values_in_the_sdks_order(value: dict[str, Any], keep_unknowns: bool | None,
                                                                   keep_internal: bool | None) -> None:
    struct = struct_pb2.Struct()
    struct.update(value)
    ours = sdk_shortcuts._Deserializer(rpc.deserialize_properties).deserialize_properties(struct, keep_unknowns,
                                                                                     keep_internal)
    assert _ordered(ours) == _ordered(rpc.deserialize_properties(struct, keep_unknowns, keep_internal))


def _args_values() -> st.SearchStrategy[Any]:
    """Args instances of a scale set's inputs, with plain values, enums, lists and dicts in them."""
    text = st.text(max_size=6)
    sku = st.builds(compute.SkuArgs, name=text, tier=st.none() | text, capacity=st.none() | st.integers(0, 1000))
    disk = st.builds(compute.VirtualMachineScaleSetOSDiskArgs, create_option=st.just("FromImage"),
                     disk_size_gb=st.none() | st.integers(1, 4096),
                     caching=st.none() | st.sampled_from(list(compute.CachingTypes)),
                     managed_disk=st.none() | st.builds(compute.VirtualMachineScaleSetManagedDiskParametersArgs,
                                                        storage_account_type=st.none() | text))
    ip = st.builds(compute.VirtualMachineScaleSetIPConfigurationArgs, name=text, primary=st.none() | st.booleans(),
                   subnet=st.none() | st.builds(compute.ApiEntityReferenceArgs, id=text))
    nic = st.builds(compute.VirtualMachineScaleSetNetworkConfigurationArgs, name=text,
                    ip_configurations=st.lists(ip, max_size=3) | st.lists(ip, max_size=2).map(tuple))
    return st.one_of(sku, disk, nic, st.lists(st.one_of(sku, disk), max_size=3))


@settings(max_examples=200, deadline=None)
@given(value=st.one_of(_args_values(), _JSON, st.dictionaries(_KEYS, st.one_of(_args_values(), _JSON), max_size=4)),
       typ=st.sampled_from([None, *pulumi_types.input_type_types(compute.VirtualMachineScaleSetArgs).values(),
                            compute.SkuArgs, compute.VirtualMachineScaleSetNetworkConfigurationArgs,
                            compute.VirtualMachineScaleSetOSDiskArgs, compute.VirtualMachineScaleSetIPConfigurationArgs,
                            typing.Mapping[str, str], typing.Sequence[compute.SkuArgs], Any,
                            # a union the SDK reduces by the value's shape
                            typing.Union[compute.VirtualMachineScaleSetManagedDiskParametersArgs,  # noqa: UP007
                                         compute.UpgradePolicyArgs]]))
# a dict under an Args annotation: its Python names become the Pulumi ones
@example(value={"disk_size_gb": 1.0, "create_option": "x", "zz": None}, typ=compute.VirtualMachineScaleSetOSDiskArgs)
@example(value={"mode": "Manual"}, typ=typing.Union[  # noqa: UP007
    compute.VirtualMachineScaleSetManagedDiskParametersArgs, compute.UpgradePolicyArgs])
@example(value={"storage_account_type": "Premium_LRS"}, typ=typing.Union[  # noqa: UP007
    compute.VirtualMachineScaleSetManagedDiskParametersArgs, compute.UpgradePolicyArgs])
def test_the_serializer_gives_the_sdks_values_in_the_sdks_order(value: Any, typ: Any) -> None:
    def serialized(function: Any) -> tuple[Any, Any, list[Any]]:
        deps: list[Any] = []
        try:
            result = mockplan._at_once(lambda: function(value, deps, "prop", None, str.upper, typ))
        except (AssertionError, ValueError) as refused:  # the SDK refuses some value and annotation pairs
            return "refused", str(refused), deps
        return "ok", _ordered(result), deps

    assert serialized(sdk_shortcuts._Serializer(rpc.serialize_property).serialize_property) == serialized(
        rpc.serialize_property)


@settings(max_examples=300, deadline=None)
@given(value=st.recursive(st.one_of(_LEAVES, st.just(Unknown())), lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(_KEYS, inner, max_size=4)), max_leaves=20))
def test_the_unknowns_walk_answers_as_the_sdks_does(value: Any) -> None:
    shared = [value, {"again": value}, value]  # one object reached twice
    assert sdk_shortcuts._contains_unknowns(value) == rpc.contains_unknowns(value)
    assert sdk_shortcuts._contains_unknowns(shared) == rpc.contains_unknowns(shared)


def test_remembered_annotations_unwrap_as_the_sdks_do() -> None:
    classes = [compute.VirtualMachineScaleSetArgs, compute.VirtualMachineScaleSetVMProfileArgs,
               compute.VirtualMachineScaleSetOSProfileArgs, compute.VirtualMachineScaleSet]
    hints = [hint for cls in classes for hint in typing.get_type_hints(cls.__init__).values()]
    hints += [typing.Optional[int], typing.Union[None, int], pulumi.Input[str], pulumi.Output[str]]  # noqa: UP007, UP045
    for function in (pulumi_types.unwrap_type, pulumi_types.unwrap_optional_type):
        remembered = sdk_shortcuts._memoized_by_identity(function)
        for hint in hints * 2:  # the second time from memory
            try:
                expected: Any = function(hint)
            except AssertionError:
                with pytest.raises(AssertionError):
                    remembered(hint)
                continue
            assert remembered(hint) == expected, hint


@pytest.mark.parametrize("failed", [None, RuntimeError("the engine refused it")])
def test_a_property_output_resolves_to_what_the_sdks_four_futures_gather(failed: Exception | None) -> None:
    class Holder:
        """Stands in for a resource: outputs are set on its __dict__."""

    async def resolved(transfer: Any) -> list[Any]:
        res, dep = Holder(), Holder()
        resolvers = transfer(res, {"urn": None, "id": None, "name": None, "tags": None}, True)
        for key, resolve in resolvers.items():
            resolve({"k": key}, key == "name", key == "tags", {dep}, failed)
        seen: list[Any] = sorted(resolvers)
        for key in sorted(resolvers):
            try:
                data = await res.__dict__[key]._data
            except RuntimeError as error:
                seen.append(("failed", str(error)))
                continue
            resources = {id(r) for r in data.resources} == {id(res), id(dep)}
            seen.append((data.value, data.is_known, data.is_secret, resources))
        return seen

    loop = asyncio.new_event_loop()  # not asyncio.run: it leaves no current loop for the next test
    try:
        ours = loop.run_until_complete(resolved(sdk_shortcuts._PropertyOutputs().transfer_properties))
        sdks = loop.run_until_complete(resolved(rpc.transfer_properties))
    finally:
        loop.close()
        # the SDK tracks a failed Output until a run's end: none of this loop's for the next run
        mockplan._discard_pending()
    assert ours == sdks


@pytest.mark.parametrize(("name", "type_", "parent"), [
    ("a", "random:index/randomString:RandomString", None),
    ("b", "kilonode:azure:Cluster", "urn:pulumi:s::p::kilonode:azure:Cluster::c"),
    ("c", "x:y:Z", ""),
])
def test_the_mock_urn_is_the_sdks(name: str, type_: str, parent: str | None) -> None:
    def program() -> None:
        pulumi.export("ours", sdk_shortcuts._urn_maker(SDK_CREATE_URN)(name, type_, parent))
        pulumi.export("sdks", SDK_CREATE_URN(name, type_, parent))

    outputs = run_program("local", {}, program).outputs
    assert outputs["ours"] == outputs["sdks"]
    assert outputs["ours"].endswith(f"{type_}::{name}")


@settings(max_examples=300, deadline=None)
@given(edges=st.lists(st.tuples(st.integers(0, 11), st.integers(0, 11)), max_size=80),
       births=st.permutations(range(12)), born=st.sets(st.integers(0, 11)))
def test_ranking_by_construction_refuses_exactly_the_edges_the_sdks_refuses(
        edges: list[tuple[int, int]], births: list[int], born: set[int]) -> None:
    sdk_nodes, our_nodes = [Node() for _ in range(12)], [Node() for _ in range(12)]
    # some nodes constructed (in any order: a component's children come after what waits on it)
    ours = _CycleBreaker({id(our_nodes[i]): births[i] + 1 for i in born})
    for a, b in edges:
        assert ours.declare_dependency(our_nodes[a], our_nodes[b]) == sdk_cycles.declare_dependency(
            sdk_nodes[a], sdk_nodes[b]), (a, b)
        ranks = list(ours._rank.values())
        assert len(set(ranks)) == len(ranks)  # an order: no two resources share a rank


def test_a_fast_path_whose_sdk_parts_are_missing_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    def program() -> None:
        seen.extend([rpc.serialize_property, rpc.deserialize_properties])
        random.RandomString("a", length=4)

    monkeypatch.delattr(pulumi_types, "_wire_union_members")  # as in an SDK without it
    graph = run_program("local", {}, program)
    assert [r.name for r in graph.resources] == ["a"]
    assert seen[0] is SDK_FUNCTIONS["serialize_property"]  # the serializer needs it: the SDK's own ran
    assert seen[1] is not SDK_FUNCTIONS["deserialize_properties"]  # the others were swapped in


def test_the_installed_sdk_has_every_part_the_shortcuts_use_and_is_the_pinned_minor() -> None:
    # a shortcut whose parts are missing is left out silently at run time (the answers stay the
    # SDK's); here it fails instead, so a new SDK that drops one is seen before plans slow down
    assert sdk_shortcuts.missing_sdk_parts() == []
    pinned = re.search(r'"pulumi~=(\d+\.\d+)\.\d+"', (REPO_ROOT / "pyproject.toml").read_text())
    assert pinned, "pyproject.toml pins pulumi to its tested minor (pulumi~=X.Y.Z)"
    installed = importlib.metadata.version("pulumi")
    assert installed.startswith(pinned.group(1) + "."), f"the installed SDK {installed} is not the pinned minor"


def test_a_missing_sdk_part_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(pulumi_types, "_wire_union_members")
    assert sdk_shortcuts.missing_sdk_parts() == ["pulumi._types._wire_union_members"]
