"""What many test modules read about the shipped stacks, computed once per test process.

Planning, rendering and recording a shipped stack are pure and deterministic, and the Pulumi
mock engine's recording is the most expensive step of the fast suite (a research-7500 graph
takes seconds): each is done once per pytest process (once per xdist worker) and shared; the
xdist workers also share the graphs with each other through files (`graphs_across_workers`).
A test that checks determinism or a code path itself still calls the package, not these.

Several modules validate the same in-cluster objects against the same Kubernetes schema
(every object, then each subsystem's own): `validate_object` checks each object once per
version.

What a test may change is handed out as a copy: `rendered` gives fresh dicts (the files in
them are frozen). Plans are frozen models; graphs are shared as the session `graphs`
fixture always shared them, read-only.
"""

from __future__ import annotations

import copy
import fcntl
import functools
import json
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from kilonode.azure.graph import Graph
from kilonode.config import load_stack
from kilonode.paths import EXAMPLE_STACKS_DIR
from kilonode.plan import ClusterPlan, plan_stack
from kilonode.render import HostFiles, render_cluster

SHIPPED_STACKS = ("local", "research-2500", "research-7500")


def cluster_value(name: str) -> dict[str, Any]:
    """A shipped stack file's `kilonode:cluster` value, a fresh copy."""
    document = yaml.safe_load((EXAMPLE_STACKS_DIR / f"Pulumi.{name}.yaml").read_text())
    return copy.deepcopy(document["config"]["kilonode:cluster"])


def with_leases(name: str, members: int = 3) -> dict[str, Any]:
    """A shipped stack's cluster value with the optional leases cluster (etcd.leases) added, in
    the shape of the stack's events cluster (its VM size, local disk and quota)."""
    cluster = cluster_value(name)
    events = cluster.setdefault("etcd", {}).get("events", {})
    cluster["etcd"]["leases"] = {**{k: v for k, v in events.items() if k != "members"}, "members": members}
    return cluster


def _shipped(stack: str) -> str:
    # a stack file written by a test may change under the same path: only shipped stacks are cached
    if stack not in SHIPPED_STACKS:
        raise ValueError(f"{stack!r} is not a shipped stack ({', '.join(SHIPPED_STACKS)})")
    return stack


@functools.cache
def plan(stack: str) -> ClusterPlan:
    """The plan of a shipped stack."""
    return plan_stack(load_stack(_shipped(stack)))


@functools.cache
def recorded_graph(stack: str) -> Graph:
    """The shipped stack's resource graph under Pulumi's mock engine (`kilonode plan`'s)."""
    from tests.graphcache import recorded  # imports the Pulumi SDKs: only when a graph is asked for

    return recorded(load_stack(_shipped(stack)))


def graphs_across_workers(directory: Path, worker: int) -> dict[str, Graph]:
    """Every shipped stack's graph, recorded by the xdist worker that gets to it first and read
    by the others from `directory` (one pickle per stack, written under the stack's lock).

    Workers take the stacks in different orders (the first the biggest, the second the
    smallest), so two workers asking at once record different stacks side by side instead of
    one waiting for, or repeating, the other's work."""
    order = SHIPPED_STACKS[::-1] if worker % 2 == 0 else SHIPPED_STACKS
    graphs: dict[str, Graph] = {}
    busy: list[str] = []
    for stack in order:
        with (directory / f"{stack}.lock").open("a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                busy.append(stack)  # another worker is recording it: take the next first
                continue
            graphs[stack] = _recorded_or_read(directory, stack)
    for stack in busy:
        with (directory / f"{stack}.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            graphs[stack] = _recorded_or_read(directory, stack)
    return {stack: graphs[stack] for stack in SHIPPED_STACKS}


def _recorded_or_read(directory: Path, stack: str) -> Graph:
    path = directory / f"{stack}.graph.pickle"
    if path.exists():
        graph: Graph = pickle.loads(path.read_bytes())
        return graph
    graph = recorded_graph(stack)
    partial = path.with_suffix(".partial")
    partial.write_bytes(pickle.dumps(graph))
    partial.replace(path)  # whole or absent, should a worker die while writing
    return graph


@functools.cache
def _rendered(stack: str) -> dict[str, HostFiles]:
    return render_cluster(plan(stack))


def rendered(stack: str) -> dict[str, HostFiles]:
    """render_cluster of the stack's plan: host -> path -> file, the dicts the caller's own."""
    return {host: dict(files) for host, files in _rendered(stack).items()}


# libyaml's parser where PyYAML has it: the same documents, in a tenth of the pure-Python
# parser's time (the cloud-configs in research-7500's custom data are a megabyte together)
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str | bytes) -> Any:
    """yaml.safe_load, on libyaml."""
    return yaml.load(text, Loader=_YAML_LOADER)  # a safe loader: C or Python


_VALID: set[tuple[str, str]] = set()


def validate_object(document: Mapping[str, Any], version: str) -> None:
    """kubernetes_validate.validate(document, version, strict=True), which raises on an invalid
    object; an object found valid at a version (same JSON, key for key) is not checked again."""
    try:
        key = (json.dumps(document, sort_keys=True), version)
    except TypeError:  # not plain JSON: nothing to key it by, so check it every time
        kubernetes_validate.validate(document, version, strict=True)
        return
    if key not in _VALID:
        kubernetes_validate.validate(document, version, strict=True)
        _VALID.add(key)
