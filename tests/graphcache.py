"""Recorded graphs kept on disk between test runs, keyed by everything that goes into them.

Recording a stack under Pulumi's mock engine is the fast suite's most expensive step (seconds
for research-7500), and it is a pure function of the toolkit's source and data, the stack's
value and the installed Pulumi SDKs: the same inputs give the same graph
(tests/azure/test_plan_command.py checks that by recording twice). So a graph a test reads is
kept under ~/.cache/kilonode/test-graphs/<source key>/ and read back while none of those inputs
changed; any edit to the package, its templates and data or the SDKs' versions gives a new key
(older keys' folders are removed after an hour). The tests of the program itself (its entry
point, determinism, the restart guard, refusals) still run the mock engine every time.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pickle
import shutil
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

from kilonode.azure.graph import Graph
from kilonode.config import Stack
from kilonode.image.cache import cache_root
from kilonode.paths import REPO_ROOT

# what a recorded graph is made of, besides the stack's own value
SOURCES = ("infra/kilonode", "templates", "sysctl", "node-image/binaries.toml", "node-image/binaries.lock.toml",
           "node-image/recipe.toml")
SUFFIXES = frozenset({".py", ".yaml", ".toml", ".j2", ".json", ".txt", ".conf", ""})
SDKS = ("pulumi", "pulumi-azure-native", "pulumi-kubernetes", "pulumi-tls", "pulumi-random", "pulumi-command")
STALE_AFTER_S = 3600


@functools.cache
def source_key() -> str:
    assert REPO_ROOT is not None, "runs from a source checkout"
    digest = hashlib.sha256()
    for name in SOURCES:
        root = REPO_ROOT / name
        for path in sorted([root] if root.is_file() else root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix in SUFFIXES:
                digest.update(path.relative_to(REPO_ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    for sdk in SDKS:
        digest.update(f"{sdk}={version(sdk)}\0".encode())
    return digest.hexdigest()[:24]


def _folder() -> Path:
    folder = cache_root() / "test-graphs" / source_key()
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        for other in folder.parent.iterdir():  # a bounded cache: the keys of older sources go
            if other != folder and time.time() - other.stat().st_mtime > STALE_AFTER_S:
                shutil.rmtree(other, ignore_errors=True)
    return folder


def recorded(stack: Stack) -> Graph:
    """The stack's graph as `kilonode plan` records it (run_plan), from the cache when these
    very inputs were recorded before."""
    from kilonode.azure.mockplan import cluster_value, run_plan

    return _cached([stack.name, cluster_value(stack)], lambda: run_plan(stack))


def recorded_program(stack_name: str, raw: Any, previous_outputs: dict[str, Any] | None = None) -> Graph:
    """run_program(stack_name, raw, None, previous_outputs), from the cache when these very
    inputs were recorded before. A run the program refuses raises every time (only graphs are
    kept)."""
    from kilonode.azure.mockplan import run_program

    return _cached([stack_name, raw, previous_outputs], lambda: run_program(stack_name, raw, None, previous_outputs))


def _cached(inputs: list[Any], record: Callable[[], Graph]) -> Graph:
    value = json.dumps(inputs, sort_keys=True, default=str)
    path = _folder() / f"{hashlib.sha256(value.encode()).hexdigest()[:24]}.pickle"
    if path.is_file():
        try:
            graph: Graph = pickle.loads(path.read_bytes())
            return graph
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError):
            path.unlink(missing_ok=True)  # written by another version of the classes: record again
    graph = record()
    partial = path.with_name(f"{path.stem}.{os.getpid()}.partial")
    partial.write_bytes(pickle.dumps(graph))
    partial.replace(path)  # whole or absent
    return graph
