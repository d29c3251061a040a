"""Preflight's tests: the shipped stacks' artefacts (shared with the other test modules) and
copies of them with one break planted."""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest

from kilonode.preflight import Inputs
from kilonode.preflight.load import from_parts
from kilonode.render.cluster import render_tree
from tests import shared


def artefacts(stack: str) -> tuple[dict[str, str], dict[str, Any]]:
    """A shipped stack's render ("<host>/<path>" -> text) and recorded graph (JSON form), as
    copies a test may plant a break in."""
    return dict(_files(stack)), copy.deepcopy(_graph_json(stack))


def inputs_of(stack: str, files: dict[str, str] | None = None, graph: dict[str, Any] | None = None) -> Inputs:
    """Preflight's inputs for a shipped stack, with `files`/`graph` in place of its own when given
    (the stack's own are shared, read-only: the checks read their inputs and change nothing)."""
    return from_parts(shared.plan(stack), files if files is not None else _files(stack),
                      graph if graph is not None else _graph_json(stack), source=stack)


@functools.cache
def _files(stack: str) -> dict[str, str]:
    return {path: f.content for path, f in render_tree(_config(stack), shared.plan(stack)).items()}


_GRAPHS: dict[str, dict[str, Any]] = {}


def _graph_json(stack: str) -> dict[str, Any]:
    if stack not in _GRAPHS:
        _GRAPHS[stack] = shared.recorded_graph(stack).to_json()
    return _GRAPHS[stack]


def _config(stack: str) -> Any:
    from kilonode.config import load_stack

    return load_stack(stack).config


def resource(graph: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    """The recorded Kubernetes object of this kind and metadata.name (to plant a break in)."""
    found = [r for r in graph["resources"] if r["type"].endswith(f":{kind}")
             and (r["inputs"].get("metadata") or {}).get("name") == name]
    assert len(found) == 1, f"{len(found)} {kind} named {name}"
    return found[0]


@pytest.fixture(params=shared.SHIPPED_STACKS)
def shipped(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True)
def _no_azure_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """The quota check asks Azure when these are set: never from a test."""
    monkeypatch.delenv("AZURE_SUBSCRIPTION_ID", raising=False)
    monkeypatch.delenv("AZURE_ACCESS_TOKEN", raising=False)
