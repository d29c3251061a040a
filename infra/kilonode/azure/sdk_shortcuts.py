"""The mock run's shortcuts through Pulumi's SDK: the same answers, in less time.

`kilonode plan` runs the Pulumi program under the SDK's mock engine (kilonode.azure.mockplan),
and the SDK's per-resource work is made for a real engine across gRPC: capturing each
registration's Python stack, checking every dependency edge for a cycle over the whole graph,
sending each monitor call through a thread pool, and serialising and reading back every
property through paths that redo typing introspection at every value. For the length of one
run only, each of those is swapped for a path that gives the SDK's own answers, and the SDK's
is put back afterwards; a swap whose SDK parts are missing (another SDK version) is left out,
and the SDK's own path kept. `pulumi up` never runs any of this. The SDK is pinned to the
minor they were tested with (pyproject.toml), and a test holds it to SDK_PARTS.

tests/azure/test_mock_engine.py compares each with the SDK's own function (mostly with
hypothesis), and the monitor's requests and answers of a whole stack byte for byte with and
without them. docs/benchmarks.md has the figures.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import inspect
import itertools
import typing
from collections import abc
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any

import pulumi
from google.protobuf import struct_pb2
from pulumi import _types as sdk_types
from pulumi.output import Unknown, _OutputData
from pulumi.runtime import known_types, rpc, settings
from pulumi.runtime import resource as sdk_resource
from pulumi.runtime import resource_cycle_breaker as sdk_cycles
from pulumi.runtime.proto import source_pb2


@contextlib.contextmanager
def _no_stack_traces() -> Iterator[None]:
    """Skip the SDK's capture of the Python stack at every registration, for this run.

    The SDK walks and formats the whole stack for each resource (traceback.extract_stack) to
    send the engine its source position; the mock monitor drops it, and at research-7500
    (~560 resources) it was about a tenth of the run. The SDK has no setting for it, so the
    function is swapped for one returning the empty trace it returns itself when it finds no
    user frame, and restored afterwards; an SDK without it is left as it is."""
    original = getattr(sdk_resource, "_get_stack_trace", None)
    if original is None:
        yield
        return
    sdk_resource._get_stack_trace = source_pb2.StackTrace
    try:
        yield
    finally:
        sdk_resource._get_stack_trace = original


class _CycleBreaker:
    """The SDK's dependency-cycle check (pulumi.runtime.resource_cycle_breaker) with the same
    answers, kept in time that does not grow with the graph.

    Before each dependency edge `from -> to` (an input's resource, or a depends_on entry: a
    component counts as each of its children) the SDK walks everything `to` transitively
    depends on, looking for `from`, and refuses the edge where it finds it (a cycle would hang
    the awaiting of URNs). Each walk grows with the graph, and there is an edge per input
    resource: at a 30,000-node variant of research-7500 (304 scale sets, each waiting on the
    scale sets of an earlier wave) the walks were a quarter of the run.

    Here every resource has a rank, with everything a resource depends on ranked below it (an
    online topological order, Pearce and Kelly 2006): an edge to a lower rank closes no cycle
    and is recorded at once. Otherwise only the resources ranked between the two ends are
    searched, for a path back (the edge is refused, as by the SDK) or to re-rank them. A
    resource is first ranked by when it was constructed (`born`, where known): what it
    depends on was constructed before it, nearly always, so that is nearly every edge. (Ranked
    instead by when it was first seen, below all as a dependency and above all registering, a
    scale set a later wave waits for, or a certificate request a timer reads, was often seen
    first as a dependency, then registered with edges to higher ranks: ~500 re-rankings over
    wide windows at the 59,000-node variant, ~0.05 s.) Any rank will do for a resource with no
    edges yet; construction order is even, the others odd, so no two are equal.
    tests/azure/test_mock_engine.py compares the answers.
    """

    def __init__(self, born: Mapping[int, int] | None = None) -> None:
        self._born = born if born is not None else {}  # id(resource) -> its place in construction order
        self._rank: dict[int, int] = {}  # id(resource) -> its rank
        self._below: dict[int, list[int]] = {}  # id(resource) -> what it depends on
        self._above: dict[int, list[int]] = {}  # id(resource) -> what depends on it
        self._kept: list[Any] = []  # the resources ranked, alive while their ids are keys
        self._lowest, self._highest = -1, 1  # odd: ranks given outside construction order

    def _ranked(self, resource: Any, below_all: bool) -> int:
        key = id(resource)
        if key not in self._rank:
            self._kept.append(resource)
            born = self._born.get(key)
            if born is not None:
                self._rank[key] = 2 * born
            elif below_all:
                self._lowest -= 2
                self._rank[key] = self._lowest
            else:
                self._highest += 2
                self._rank[key] = self._highest
        return key

    def declare_dependency(self, from_resource: Any, to_resource: Any) -> bool:
        if from_resource is to_resource:
            return False
        to = self._ranked(to_resource, below_all=True)
        frm = self._ranked(from_resource, below_all=False)
        if self._rank[to] > self._rank[frm] and not self._reorder(frm, to):
            return False
        self._below.setdefault(frm, []).append(to)
        self._above.setdefault(to, []).append(frm)
        return True

    def _reorder(self, frm: int, to: int) -> bool:
        """Rank `to` and what it depends on below `from` and what depends on it; False, with
        nothing changed, where `to` depends on `from` already (the edge would close a cycle).

        A path to -> ... -> from only passes resources ranked between the two, so the searches
        stay there: down from `to`, and up from `from`."""
        low, high = self._rank[frm], self._rank[to]
        down = self._reach(to, self._below, lambda rank: rank > low, stop=frm)
        if down is None:
            return False
        up = self._reach(frm, self._above, lambda rank: rank < high, stop=None)
        assert up is not None  # no stop to find
        order = sorted(down, key=self._rank.__getitem__) + sorted(up, key=self._rank.__getitem__)
        for key, rank in zip(order, sorted(self._rank[k] for k in order), strict=True):
            self._rank[key] = rank
        return True

    def _reach(self, start: int, edges: dict[int, list[int]], inside: Callable[[int], bool],
               stop: int | None) -> list[int] | None:
        """`start` and what `edges` lead to from it through ranks `inside` allows; None where
        that includes `stop`."""
        seen, todo = {start}, [start]
        while todo:
            for key in edges.get(todo.pop(), ()):
                if key == stop:
                    return None
                if key not in seen and inside(self._rank[key]):
                    seen.add(key)
                    todo.append(key)
        return list(seen)


@contextlib.contextmanager
def _linear_cycle_checks(born: Mapping[int, int] | None = None) -> Iterator[None]:
    """The SDK's cycle check replaced by _CycleBreaker's for this run, and restored afterwards;
    an SDK whose rpc module no longer calls `declare_dependency` is left as it is. `born`: the
    resources' construction order as it grows (_PropertyOutputs.born)."""
    original = getattr(rpc, "declare_dependency", None)
    if original is not sdk_cycles.declare_dependency:
        yield
        return
    rpc.declare_dependency = _CycleBreaker(born).declare_dependency  # type: ignore[assignment]
    try:
        yield
    finally:
        rpc.declare_dependency = original


class _InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """Runs each call at once, in the caller's thread, and hands back its finished future.

    The SDK sends every monitor call (RegisterResource, Invoke, RegisterResourceOutputs) through
    the event loop's default executor, a thread pool, as it would a blocking gRPC call to the
    engine. The mock monitor answers in plain Python, so each registration was a round trip to
    a worker thread and back under the GIL: about a fifth of a research-7500 run's CPU. A
    ThreadPoolExecutor only by type (asyncio accepts no other as the default); it starts no
    thread.
    """

    def __init__(self) -> None:
        super().__init__(max_workers=1)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as error:  # as a worker thread would hand it back
            future.set_exception(error)
        return future


@contextlib.contextmanager
def _monitor_inline(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """`loop`'s monitor calls run inline for this run (_InlineExecutor); its default executor
    is put back afterwards (asyncio has no getter: None is the pool it makes when first asked)."""
    previous = getattr(loop, "_default_executor", None)
    loop.set_default_executor(_InlineExecutor())
    try:
        yield
    finally:
        loop._default_executor = previous  # type: ignore[attr-defined]


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection during the run; it resumes afterwards, as it was.

    A run allocates ~1M objects on top of the SDKs' modules and keeps most of them until it
    ends, so each full collection walks a heap that only grows: about a third of a
    research-7500 run's CPU, for ~10 MB of cycles, which the first collection after the run
    frees. Reference counting frees everything else as usual."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def _swapped(module: Any, name: str, replacement: Any) -> Iterator[None]:
    """`module.name` is `replacement` for this run, and the SDK's own again afterwards; an SDK
    without it is left as it is (its callers look the name up in the module at each call, so
    the swap reaches every one of them)."""
    original = getattr(module, name, None)
    if original is None:
        yield
        return
    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, original)


def _memoized_by_identity(function: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`function`, a pure function of a type annotation, remembered per annotation object (the
    annotation is kept with its answer, so its id stays its own). An annotation the function
    refuses is refused each time: only answers are remembered."""
    memo: dict[int, tuple[Any, Any]] = {}

    def remembered(annotation: Any) -> Any:
        hit = memo.get(id(annotation))
        if hit is not None and hit[0] is annotation:
            return hit[1]
        answer = function(annotation)
        memo[id(annotation)] = (annotation, answer)
        return answer

    return remembered


# The values the SDK serialises and deserialises as they are; exact types only (an enum is a
# str subclass and takes the SDK's own path).
_PLAIN = frozenset({str, int, float, bool, type(None)})
# what the SDK's serialize_property counts as a mapping annotation
_MAPPING_ORIGINS = (dict, typing.Dict, abc.Mapping, typing.Mapping)  # noqa: UP006 - the SDK's own list
_SIG = rpc._special_sig_key


class _Serializer:
    """rpc.serialize_property with the SDK's answers, for the values a plan serialises most.

    Every input of every resource passes through serialize_property, once per node of its
    value: for each node the SDK unwraps the annotation (typing introspection), tries eight
    kinds of special value (ABC isinstance checks, inspect.isawaitable) and, for an Args
    class, lists its properties and their annotations again. Here what depends only on a type
    is worked out once per type: plain str/int/float/bool/None, list, tuple and dict values and
    Args instances take the same steps as in the SDK with the type's answers remembered;
    anything else (Outputs, resources, assets, awaitables, enums, mappings keyed by a union of
    Args shapes, protobuf values, protobuf requests) goes to the SDK's own function, which
    calls back here for what it holds. Without it (run_plan's CPU, in-process, each figure
    here with the other fast paths in place): research-7500 +0.07 s, its 59,000-node variant
    +0.19 s, 0.23 ms per added scale set. tests/azure/test_mock_engine.py compares its results,
    their order and the dependencies collected with the SDK's."""

    def __init__(self, original: Callable[..., Coroutine[Any, Any, Any]]) -> None:
        # what it reads of the SDK's internals, looked up now (a missing one: no swap)
        for module, name in [(sdk_types, "_wire_union_members"), (sdk_types, "_py_properties"),
                             (sdk_types, "_PULUMI_DEPRECATED_CALLABLE"), (sdk_types, "input_type_py_to_pulumi_names")]:
            getattr(module, name)
        self._original = original
        self._unwrap = _memoized_by_identity(sdk_types.unwrap_type)
        self._element = _memoized_by_identity(rpc._get_list_element_type)
        self._keys = _memoized_by_identity(self._key_plan)
        self._classes: dict[type, tuple[tuple[tuple[str, Callable[[Any], Any]], ...], dict[str, Any]] | None] = {}

    @staticmethod
    def _key_plan(typ: Any) -> tuple[str, Any] | None:
        """How the SDK names a mapping's keys and types its values under the annotation `typ`
        (unwrapped, not Any); None where that also depends on the value (a union of shapes)."""
        if sdk_types._wire_union_members(typ) is not None:
            return None
        if sdk_types.is_input_type(typ):
            return "input", (sdk_types.input_type_py_to_pulumi_names(typ), sdk_types.input_type_types(typ))
        if typ is dict or typing.get_origin(typ) in _MAPPING_ORIGINS:
            args = typing.get_args(typ)
            if len(args) == 2 and args[0] is str:
                return "values", args[1]
            return "transformer", None  # the keys go through the caller's input_transformer
        return "none", None

    def _input_class(self, value: Any) -> tuple[tuple[tuple[str, Callable[[Any], Any]], ...], dict[str, Any]] | None:
        """For an Args instance the SDK turns into a dict (and nothing it checks for first):
        its properties' Pulumi names and getters, as input_type_to_dict reads them, and their
        annotations; None for any other value. The checks are the SDK's own, on the class."""
        cls = type(value)
        if cls in self._classes:
            return self._classes[cls]
        plan = None
        if (sdk_types.is_input_type(cls) and not isinstance(value, (abc.Sequence, abc.Mapping))
                and not (known_types.is_unknown(value) or known_types.is_resource(value)
                         or known_types.is_asset(value) or known_types.is_archive(value)
                         or known_types.is_output(value) or inspect.isawaitable(value))):
            getters = []
            for _, pulumi_name, prop in sdk_types._py_properties(cls):
                fget = prop.fget.__dict__.get(sdk_types._PULUMI_DEPRECATED_CALLABLE) or prop.fget
                getters.append((pulumi_name, fget))
            plan = (tuple(getters), sdk_types.input_type_types(cls))
        self._classes[cls] = plan
        return plan

    async def serialize_property(self, value: Any, deps: list[Any] | None, property_key: str | None,
                                 resource_obj: Any = None, input_transformer: Callable[[str], str] | None = None,
                                 typ: Any = None, keep_output_values: bool = False,
                                 exclude_resource_refs_from_deps: bool = False,
                                 return_protobuf_value: bool = False) -> Any:
        cls = type(value)
        if not return_protobuf_value:
            if cls in _PLAIN:
                if typ:
                    self._unwrap(typ)  # as the SDK does first: an annotation it refuses fails here too
                return value
            if cls is list or cls is tuple or cls is dict:
                if typ:
                    typ = self._unwrap(typ)
                if typ is Any:
                    typ = None
                if cls is dict:
                    return await self._mapping(value, deps, property_key, resource_obj, input_transformer, typ,
                                               keep_output_values, exclude_resource_refs_from_deps)
                element = self._element(typ)
                items = []
                for item in value:
                    items.append(await self._item(item, deps, property_key, resource_obj, input_transformer, element,
                                                  keep_output_values, exclude_resource_refs_from_deps))
                return items
            plan = self._input_class(value)
            if plan is not None:
                if typ:
                    self._unwrap(typ)
                getters, types = plan
                # input_type_to_dict: every getter first, Nones left out
                present = [(name, item) for name, fget in getters if (item := fget(value)) is not None]
                return {name: await self._item(item, deps, property_key, resource_obj, input_transformer,
                                               types.get(name), keep_output_values, exclude_resource_refs_from_deps)
                        for name, item in present}
        return await self._original(value, deps, property_key, resource_obj, input_transformer, typ,
                                    keep_output_values, exclude_resource_refs_from_deps, return_protobuf_value)

    async def _item(self, item: Any, deps: list[Any] | None, property_key: str | None, resource_obj: Any,
                    input_transformer: Callable[[str], str] | None, typ: Any, keep_output_values: bool,
                    exclude_resource_refs_from_deps: bool) -> Any:
        """serialize_property of a value inside a list, dict or Args instance."""
        if type(item) in _PLAIN:
            if typ:
                self._unwrap(typ)
            return item
        return await self.serialize_property(item, deps, property_key, resource_obj, input_transformer, typ,
                                             keep_output_values, exclude_resource_refs_from_deps)

    async def _mapping(self, value: dict[Any, Any], deps: list[Any] | None, property_key: str | None,
                       resource_obj: Any, input_transformer: Callable[[str], str] | None, typ: Any,
                       keep_output_values: bool, exclude_resource_refs_from_deps: bool) -> Any:
        """The SDK's Mapping case for a dict, `typ` already unwrapped."""
        translate: Callable[[str], str] | None = input_transformer
        names: dict[str, str] | None = None
        types: dict[str, Any] | None = None
        value_type = None
        if typ is not None:
            plan = self._keys(typ)
            if plan is None:
                return await self._original(value, deps, property_key, resource_obj, input_transformer, typ,
                                            keep_output_values, exclude_resource_refs_from_deps)
            kind, data = plan
            if kind == "input":
                names, types = data
            elif kind == "values":
                value_type, translate = data, None
            elif kind == "none":
                translate = None
        serialized = {}
        for key in value:
            name = (names.get(key) or key) if names is not None else translate(key) if translate is not None else key
            item_type = types.get(name) if types is not None else value_type
            # a mapping's values carry their own key as property_key, as in the SDK
            serialized[name] = await self._item(value[key], deps, key, resource_obj, input_transformer, item_type,
                                                keep_output_values, exclude_resource_refs_from_deps)
        return serialized


def _contains_unknowns(value: Any) -> bool:
    """rpc.contains_unknowns without the closure it makes at each call.

    The SDK's walk is a nested function that calls itself, so every call leaves a reference
    cycle behind: with the collector paused for the run (_gc_paused) that was ~400,000 objects
    (33 MB) at the 59,000-node variant. The same walk (an Unknown anywhere in nested dicts and
    lists, each object visited once), as plain functions. Without it: research-7500 +0.03 s,
    the 59,000-node variant +0.10 s (0.12 ms per added scale set)."""
    return _unknown_in(value, set())


def _unknown_in(value: Any, seen: set[int]) -> bool:
    if type(value) in _PLAIN:
        return False
    if known_types.is_unknown(value):
        return True
    if id(value) in seen:
        return False
    seen.add(id(value))
    if isinstance(value, dict):
        for key in value:
            if _unknown_in(value[key], seen):
                return True
    elif isinstance(value, list):
        for item in value:
            if _unknown_in(item, seen):
                return True
    return False


class _PropertyOutputs:
    """rpc.transfer_properties with one future per property, the way the SDK already makes a
    resource's `urn` and `id` outputs (runtime.resource.resource_output).

    A resource gets an Output for each of its properties before it is registered (a scale set
    has 40, most of them None), and the SDK makes each from four futures that a task of its
    own gathers into the Output's data once the engine answers: five awaitables and a task per
    property. Here the answer sets the Output's data directly, with what the SDK's task would
    have gathered (the dependencies plus the resource, the value, known, secret; or the
    failure). Without it: research-7500 +0.09 s, the 59,000-node variant +0.27 s (0.35 ms per
    added scale set).

    Also numbers the resources as they are constructed (transfer_properties runs in every
    resource's constructor), for _CycleBreaker's ranks."""

    def __init__(self) -> None:
        self.born: dict[int, int] = {}  # id(resource) -> its place in construction order
        self._constructed = itertools.count(1)

    def transfer_properties(self, res: Any, props: Any, custom: bool) -> dict[str, Callable[..., None]]:
        self.born[id(res)] = next(self._constructed)
        resolvers: dict[str, Callable[..., None]] = {}
        for name in props:
            if name == "urn" or (name == "id" and custom):
                continue  # as in the SDK: the resource's own outputs, made elsewhere
            resolvers[name], res.__dict__[name] = _property_output(res)
        return resolvers


def _property_output(res: Any) -> tuple[Callable[..., None], pulumi.Output[Any]]:
    data: asyncio.Future[Any] = asyncio.Future()

    def resolve(value: Any, is_known: bool, is_secret: bool, deps: Any, failed: BaseException | None) -> None:
        if data.cancelled():  # _discard_pending after a failed run: the SDK's four futures were not
            return
        if failed is not None:
            data.set_exception(failed)
            return
        resources = set(deps) if deps else set()
        resources.add(res)
        data.set_result(_OutputData(resources=resources, value=value, is_known=is_known, is_secret=is_secret))

    return resolve, pulumi.Output._from_data(data)


class _Deserializer:
    """rpc.deserialize_properties with the SDK's answers, reading the protobuf fields directly.

    The SDK reads a Struct through protobuf's Python mapping layer (well_known_types: a list of
    items, a Python call per value to find its kind) and checks every dict and list it builds
    for secrets to push up. Here plain structs and lists are read field by field, and the
    secret check runs only where something inside was a secret; a struct with the special
    signature key (secrets, assets, archives, resource references, output values) goes to the
    SDK's own function. Every registration is read twice (RecordingMonitor.RegisterResource
    records its inputs, the SDK's resolve_outputs reads the answer). Without it: research-7500
    +0.06 s, the 59,000-node variant +0.15 s (0.17 ms per added scale set)."""

    def __init__(self, original: Callable[..., Any]) -> None:
        self._original = original
        # secrets made so far: what was read holds one only if this grew while it was read
        self._secrets = 0

    def deserialize_properties(self, props_struct: Any, keep_unknowns: bool | None = None,
                               keep_internal: bool | None = True) -> Any:
        if type(props_struct) is not struct_pb2.Struct or _SIG in props_struct.fields:
            result = self._original(props_struct, keep_unknowns, keep_internal)
            if rpc.is_rpc_secret(result):
                self._secrets += 1
            return result
        output = {}
        fields = props_struct.fields
        for key in fields:  # the map's own order, as items() gives it, without its Python generator
            if keep_internal is False and key.startswith("__") and key != "__provider":
                continue
            item = self._value(fields[key], keep_unknowns, keep_internal)
            if item is not None:  # as in the SDK: what deserialises to None is left out
                output[key] = item
        return output

    def _value(self, value: Any, keep_unknowns: bool | None, keep_internal: bool | None) -> Any:
        """deserialize_property of a struct's or a list's value."""
        kind = value.WhichOneof("kind")
        if kind == "string_value":
            text = value.string_value
            if text == rpc.UNKNOWN:
                return Unknown() if settings.is_dry_run() or keep_unknowns else None
            return text
        if kind == "bool_value":
            return value.bool_value
        if kind == "number_value":
            return value.number_value
        if kind == "struct_value":
            before = self._secrets
            props = self.deserialize_properties(value.struct_value, keep_unknowns, keep_internal)
            if (self._secrets != before and isinstance(props, dict)
                    and any(rpc.is_rpc_secret(v) for v in props.values())):
                self._secrets += 1
                return rpc.wrap_rpc_secret({k: rpc.unwrap_rpc_secret(v) for k, v in props.items()})
            return props
        if kind == "list_value":
            before = self._secrets
            values = [self._value(item, keep_unknowns, keep_internal) for item in value.list_value.values]
            if self._secrets != before and any(rpc.is_rpc_secret(v) for v in values):
                self._secrets += 1
                return rpc.wrap_rpc_secret([rpc.unwrap_rpc_secret(v) for v in values])
            return values
        if kind == "null_value":
            return None
        raise ValueError("Value not set")  # what protobuf's Struct reading raises


def _urn_maker(original: Callable[..., pulumi.Output[str]]) -> Callable[..., pulumi.Output[str]]:
    """runtime.resource.create_urn worked out at once where its inputs are plain strings.

    The SDK's registration computes a URN of its own for the case where there is no monitor to
    ask (`mock_urn`, unused when there is one, as here) through Output.from_input, Output.all and
    two applies: four Outputs and their tasks per resource (without this: research-7500
    +0.05 s, the 59,000-node variant +0.07 s). The same string, from the same expressions, as a
    known Output with no dependencies, as those give for plain strings; anything else goes to
    the SDK's own function."""

    def create_urn(name: Any, type_: Any, parent: Any = None, project: str | None = None,
                   stack: str | None = None) -> pulumi.Output[str]:
        if type(name) is not str or type(type_) is not str or not (parent is None or type(parent) is str):
            return original(name, type_, parent, project, stack)
        if parent is not None:
            prefix = parent[0:parent.rfind("::")] + "$"
        else:
            prefix = ("urn:pulumi:" + (stack if stack is not None else settings.get_stack()) + "::"
                      + (project if project is not None else settings.get_project()) + "::")
        return pulumi.Output.from_input(prefix + type_ + "::" + name)

    return create_urn


def _depends_on_resolver(original: Callable[..., Coroutine[Any, Any, set[str]]]
                         ) -> Callable[..., Coroutine[Any, Any, set[str]]]:
    """runtime._depends_on._resolve_depends_on_urns without an Output per entry, for a plain
    list of resources.

    The SDK turns the list and each of its entries into an Output, awaits each one's resources
    and value, and gathers the resources into a set: for a resource entry, the resource itself.
    Each scale set of the 59,000-node variant waits for its wave's timer and the scale sets of
    an earlier wave (kilonode.azure.join_waves): ~10 entries each. The same set, built by the
    same steps (so it iterates in the same order), then expanded by the SDK's own function;
    anything but a list of resources goes to the SDK's own resolver. Without it: research-7500
    +0.02 s, the 59,000-node variant +0.05 s."""

    async def resolve_depends_on_urns(depends_on: Any, from_resource: Any = None) -> set[str]:
        if type(depends_on) is not list or not all(isinstance(d, pulumi.Resource) for d in depends_on):
            return await original(depends_on, from_resource)
        if not depends_on:
            return set()
        resources: set[Any] = set()
        for dependency in depends_on:
            # _resolve_depends_on: the union with the entry's Output's (empty) resources, then the entry
            resources = resources | set()
            resources.add(dependency)
        expanded = await rpc._expand_dependencies(resources, from_resource)
        return set(expanded.keys())

    return resolve_depends_on_urns


@contextlib.contextmanager
def _fast_sdk_paths(outputs: _PropertyOutputs) -> Iterator[None]:
    """The SDK's per-resource paths above, swapped in for this run and restored afterwards.

    Each gives the SDK's own answers (tests/azure/test_mock_engine.py: the same requests to the
    monitor, byte for byte, and the same graph, with and without them). unwrap_type and
    unwrap_optional_type are pure functions of an annotation that the SDK works out again for
    every property of every value it sends or reads (typing introspection): remembered per
    annotation (the serializer keeps its own memory; what is left, the outputs read back, is
    ~0.01 s at research-7500, 0.02 s at the 59,000-node variant). All of them together, with
    _CycleBreaker ranking by construction order (run_plan's CPU, in-process): research-7500
    0.83 -> 0.52 s, its 59,000-node variant 2.33 -> 1.31 s; per added scale set 2.9 -> 1.55 ms."""
    if settings.excessive_debug_output:  # the SDK's paths log each property: keep them
        yield
        return
    # every replacement made from the SDK's own functions before any is swapped in; one whose
    # SDK parts are missing (another SDK version) is left out, and the SDK's own path kept
    factories: list[tuple[Any, str, Callable[[], Any]]] = [
        (sdk_types, "unwrap_type", lambda: _memoized_by_identity(sdk_types.unwrap_type)),
        (sdk_types, "unwrap_optional_type", lambda: _memoized_by_identity(sdk_types.unwrap_optional_type)),
        (rpc, "serialize_property", lambda: _Serializer(rpc.serialize_property).serialize_property),
        (rpc, "contains_unknowns", lambda: _contains_unknowns),
        (rpc, "transfer_properties", lambda: outputs.transfer_properties),
        (rpc, "deserialize_properties", lambda: _Deserializer(rpc.deserialize_properties).deserialize_properties),
        (sdk_resource, "create_urn", lambda: _urn_maker(sdk_resource.create_urn)),
        (sdk_resource, "_resolve_depends_on_urns", lambda: _depends_on_resolver(sdk_resource._resolve_depends_on_urns)),
    ]
    swaps = []
    for module, name, factory in factories:
        with contextlib.suppress(AttributeError):
            swaps.append((module, name, factory()))
    with contextlib.ExitStack() as stack:
        for module, name, replacement in swaps:
            stack.enter_context(_swapped(module, name, replacement))
        yield


# Every part of the SDK the shortcuts above read or swap (module, name): on another SDK a missing
# one turns a shortcut off (the SDK's own path runs, the answers are the same, the run slower).
# pyproject.toml pins the SDK to the minor these were written and tested against, and
# tests/azure/test_mock_engine.py holds the installed SDK to this list, so a new SDK that drops a
# part fails a test instead of slowing every plan silently.
SDK_PARTS: tuple[tuple[Any, str], ...] = (
    *((known_types, n) for n in ("is_archive", "is_asset", "is_output", "is_resource", "is_unknown")),
    *((rpc, n) for n in ("UNKNOWN", "_expand_dependencies", "_get_list_element_type", "_special_sig_key",
                         "contains_unknowns", "declare_dependency", "deserialize_properties", "is_rpc_secret",
                         "serialize_property", "transfer_properties", "unwrap_rpc_secret", "wrap_rpc_secret")),
    *((sdk_resource, n) for n in ("_get_stack_trace", "_resolve_depends_on_urns", "create_urn")),
    *((sdk_types, n) for n in ("_PULUMI_DEPRECATED_CALLABLE", "_py_properties", "_wire_union_members",
                               "input_type_py_to_pulumi_names", "input_type_types", "is_input_type",
                               "unwrap_optional_type", "unwrap_type")),
    *((settings, n) for n in ("excessive_debug_output", "get_project", "get_stack", "is_dry_run")),
    (sdk_cycles, "declare_dependency"),
)


def missing_sdk_parts() -> list[str]:
    """The SDK parts of SDK_PARTS this SDK lacks, as `module.name`; and the cycle check, where the
    rpc module no longer calls the SDK's own (its shortcut is then off)."""
    missing = [f"{module.__name__}.{name}" for module, name in SDK_PARTS if not hasattr(module, name)]
    if getattr(rpc, "declare_dependency", None) is not getattr(sdk_cycles, "declare_dependency", None):
        missing.append("pulumi.runtime.rpc.declare_dependency is not resource_cycle_breaker's")
    return missing


@contextlib.contextmanager
def sdk_shortcuts(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """Every shortcut of this module, for one mock run on `loop`, and the SDK as it was after."""
    properties = _PropertyOutputs()
    with (_no_stack_traces(), _linear_cycle_checks(properties.born), _monitor_inline(loop), _gc_paused(),
          _fast_sdk_paths(properties)):
        yield
